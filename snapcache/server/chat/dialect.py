"""One HTTP dialect over `ChatEngine`: what turns its request body into the engine's request, and
the engine's events into its whole answer, its stream of events and its errors.

Every dialect route is the same skeleton (`routes.serve`): the body becomes a `ChatRequest`, the
engine runs it, and the events become the dialect's answer, streamed (server-sent events, or JSON
lines for Ollama's) or whole; a request that cannot be served gets the dialect's error shape, before
or after the stream began. A dialect is one `Dialect` (Anthropic Messages, OpenAI Responses, OpenAI
Chat Completions, Ollama's chat and generate): its name, the media type it streams, and the
translations its own module gives; adding one is a new module, a new `Dialect` and its route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from snapcache.server.chat import anthropic, chat_completions, ollama, responses, responses_output
from snapcache.server.chat.anthropic_protocol import MessagesRequest
from snapcache.server.chat.chat_completions_protocol import ChatCompletionRequest
from snapcache.server.chat.chat_request import ChatRequest
from snapcache.server.chat.events import ChatEvent
from snapcache.server.chat.ollama_protocol import ChatBody, GenerateBody
from snapcache.server.chat.responses_protocol import ResponsesRequest
from snapcache.server.error_answers import BadRequest

__all__ = [
    "CHAT_COMPLETIONS",
    "EVENT_STREAM",
    "MESSAGES",
    "OLLAMA_CHAT",
    "OLLAMA_GENERATE",
    "RESPONSES",
    "Body",
    "Dialect",
]

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


def _openai_error_body(failure: BadRequest) -> dict[str, Any]:
    return failure.document()


MESSAGES: Dialect[MessagesRequest] = Dialect(
    "Anthropic Messages",
    EVENT_STREAM,
    anthropic.chat_request,
    lambda body, events: anthropic.message_events(events, body.model),
    lambda body, events: anthropic.message_of(events, body.model),
    anthropic.error_body,
    anthropic.error_event,
)
RESPONSES: Dialect[ResponsesRequest] = Dialect(
    "OpenAI Responses",
    EVENT_STREAM,
    responses.chat_request,
    lambda body, events: responses_output.ResponseEvents(body).events(events),
    lambda body, events: responses_output.response_of(events, body),
    _openai_error_body,
    responses.error_event,
)
CHAT_COMPLETIONS: Dialect[ChatCompletionRequest] = Dialect(
    "OpenAI Chat Completions",
    EVENT_STREAM,
    chat_completions.chat_request,
    lambda body, events: chat_completions.CompletionChunks(body).events(events),
    lambda body, events: chat_completions.completion_of(events, body),
    _openai_error_body,
    chat_completions.error_event,
)
OllamaBody = TypeVar("OllamaBody", ChatBody, GenerateBody)


def _ollama(
    name: str, chat_request: Callable[[OllamaBody, str], ChatRequest], *, chat: bool
) -> Dialect[OllamaBody]:
    """Ollama's chat (`chat`) or generate: the same lines and errors around a message or a response."""
    return Dialect(
        name,
        ollama.NDJSON,
        chat_request,
        lambda body, events: ollama.Answer(body.model, chat=chat).lines(events),
        lambda body, events: ollama.Answer(body.model, chat=chat).of(events),
        ollama.error_body,
        ollama.error_line,
    )


OLLAMA_CHAT = _ollama("Ollama chat", ollama.chat_request, chat=True)
OLLAMA_GENERATE = _ollama("Ollama generate", ollama.generate_request, chat=False)
