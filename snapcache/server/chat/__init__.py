"""Chat dialects over one internal chat request: Anthropic Messages, OpenAI Responses, OpenAI Chat
Completions with tools, and Ollama's chat and generate.

Each dialect (a folder of `dialects`) translates its request into a `ChatRequest` (`chat_request`)
and the chat engine's events (`events`) back into its own answer, served by one skeleton
(`dialects.serving`); the engine (`engine`) is the one place a chat runs on the model. `routes`
installs them together.
"""

from __future__ import annotations

from snapcache.server.chat.chat_request import ChatMessage, ChatRequest
from snapcache.server.chat.engine.chat_engine import ChatEngine
from snapcache.server.chat.engine.prompt_rules import BILLING_HEADER_RULE, PromptRules
from snapcache.server.chat.routes import install_dialects
from snapcache.server.tools import ToolSpec

__all__ = [
    "BILLING_HEADER_RULE",
    "ChatEngine",
    "ChatMessage",
    "ChatRequest",
    "PromptRules",
    "ToolSpec",
    "install_dialects",
]
