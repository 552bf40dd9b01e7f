"""OpenAI Chat Completions, with tools: `/v1/chat/completions`."""
