"""Anthropic Messages: `/v1/messages` and its token count."""
