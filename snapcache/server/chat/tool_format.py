"""The seam between a chat request's tools and a model: how to render them, constrain and parse.

`tool_format_for` picks the format for a request and a model. Today every model gets the generic
format (`generic_tools`), which works with any template; formats native to a template (Hermes,
Llama 3, Mistral, FunctionGemma) plug in here.
"""

from __future__ import annotations

from typing import Any, Protocol

from snapcache.server.chat.request import ChatRequest, ToolCallRequest

__all__ = ["ToolFormat", "tool_format_for"]


class ToolFormat(Protocol):
    """How one request's tools and tool history reach a model, and how its calls come back."""

    def messages(self, request: ChatRequest) -> list[dict[str, Any]]:
        """The request's messages as the model's chat template takes them (tools included)."""
        ...

    def grammar(self, request: ChatRequest) -> Any | None:
        """A `LlamaGrammar` the answer must follow, or None."""
        ...

    def parse(self, text: str, request: ChatRequest) -> tuple[str, list[ToolCallRequest]]:
        """The answer's text and the calls it makes."""
        ...

    def visible_text(self, partial: str, request: ChatRequest) -> str:
        """The text the answer surely holds so far (streamed before the answer ends): a prefix of
        what `parse` gives in the end."""
        ...


def tool_format_for(request: ChatRequest, llm: Any) -> ToolFormat:
    """The format for `request` on `llm` (the loaded `llama_cpp.Llama`)."""
    from snapcache.server.chat.generic_tools import GenericTools

    return GenericTools.for_model(llm)
