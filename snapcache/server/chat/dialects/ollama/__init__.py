"""Ollama's API: chat, generate, and the routes that describe the model."""
