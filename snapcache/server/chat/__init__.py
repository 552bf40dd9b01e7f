"""Chat dialects over one internal chat request: Anthropic Messages, OpenAI Responses, OpenAI Chat
Completions with tools, and Ollama's chat and generate.

Each dialect translates its request into a `ChatRequest` and the `ChatEngine`'s events back into
its own answer (a `Dialect`: see `dialect`), served by one skeleton (`serving`); the engine is the
one place a chat runs on the model (see `engine`).
"""

from __future__ import annotations

from snapcache.server.chat.chat_request import ChatMessage, ChatRequest
from snapcache.server.chat.engine import ChatEngine
from snapcache.server.chat.routes import install_dialects
from snapcache.server.chat.rules import BILLING_HEADER_RULE, PromptRules
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
