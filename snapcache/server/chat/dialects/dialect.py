"""One HTTP dialect over the chat engine: what turns its request body into the engine's request, and
the engine's events into its whole answer, its stream of events and its errors.

Every dialect route is the same skeleton (`serving.serve`): the body becomes a `ChatRequest`, the
engine runs it, and the events become the dialect's answer, streamed (server-sent events, or JSON
lines for Ollama's) or whole; a request that cannot be served gets the dialect's error shape, before
or after the stream began. A dialect is one `Dialect` (Anthropic Messages, OpenAI Responses, OpenAI
Chat Completions, Ollama's chat and generate): its name, the media type it streams, and the
translations its own folder gives. Adding one is a new folder beside the others (its protocol, its
translations, its `Dialect` and its routes) and a line in `snapcache.server.chat.routes`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from snapcache.server.chat.chat_request import ChatRequest
from snapcache.server.chat.events import ChatEvent
from snapcache.server.error_answers import BadRequest

__all__ = ["EVENT_STREAM", "Body", "Dialect", "openai_error_body"]

Body = TypeVar("Body")
EVENT_STREAM = "text/event-stream"


@dataclass(frozen=True, slots=True)
class Dialect(Generic[Body]):
    """What a dialect route needs of its dialect (see the module docstring): each a translation."""

    name: str
    """The dialect's name, as its clients know it."""
    stream_type: str
    """The media type of its streamed answers."""
    chat_request: Callable[[Body, str], ChatRequest]
    """The engine's request for a body in a scope; BadRequest when it cannot be served."""
    stream: Callable[[Body, AsyncIterator[ChatEvent]], AsyncIterator[bytes]]
    """The dialect's streamed answer of the engine's events, an event (or line) at a time."""
    whole: Callable[[Body, list[ChatEvent]], dict[str, Any]]
    """The dialect's whole answer of the engine's events."""
    error_body: Callable[[BadRequest], dict[str, Any]]
    """The dialect's error document, answered before a stream began."""
    error_event: Callable[[BadRequest], bytes]
    """The dialect's error event, sent once a stream began."""


def openai_error_body(failure: BadRequest) -> dict[str, Any]:
    """OpenAI's error document (Chat Completions' and Responses')."""
    return failure.document()
