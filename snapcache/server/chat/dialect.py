"""One HTTP dialect over `ChatEngine`: what turns its request body into the engine's request, and
the engine's events into its whole answer, its stream of events and its errors.

Every dialect route is the same skeleton (`routes.serve`): the body becomes a `ChatRequest`, the
engine runs it, and the events become the dialect's answer, streamed or whole; a request that
cannot be served gets the dialect's error shape, before or after the stream began. A dialect is one
`Dialect` (Anthropic Messages, OpenAI Responses, OpenAI Chat Completions) and its own module of
translations; adding one is a new module, a new `Dialect` and its route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from snapcache.server.chat import anthropic, chat_completions, responses, responses_output
from snapcache.server.chat.anthropic_protocol import ConversationRequest, MessagesRequest
from snapcache.server.chat.chat_completions_protocol import ChatCompletionRequest
from snapcache.server.chat.engine import ChatEvent
from snapcache.server.chat.request import ChatRequest
from snapcache.server.chat.responses_protocol import ResponsesRequest
from snapcache.server.errors import BadRequest

__all__ = ["CHAT_COMPLETIONS", "MESSAGES", "RESPONSES", "Body", "Dialect"]

Body = TypeVar("Body", contravariant=True)


class Dialect(Protocol, Generic[Body]):
    """What a dialect route needs of its dialect (see the module docstring)."""

    @property
    def name(self) -> str:
        """The dialect's name, as its clients know it."""
        ...

    def chat_request(self, body: Body, scope: str) -> ChatRequest:
        """The engine's request for `body` in `scope`; BadRequest when it cannot be served."""
        ...

    def stream(self, body: Body, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        """The dialect's server-sent events for the engine's `events`."""
        ...

    def whole(self, body: Body, events: list[ChatEvent]) -> dict[str, Any]:
        """The dialect's whole answer of the engine's `events`."""
        ...

    def error_body(self, failure: BadRequest) -> dict[str, Any]:
        """The dialect's error document, answered before a stream began."""
        ...

    def error_event(self, failure: BadRequest) -> bytes:
        """The dialect's error event, sent once a stream began."""
        ...


def _openai_error_body(failure: BadRequest) -> dict[str, Any]:
    return failure.document()


@dataclass(frozen=True, slots=True)
class _Messages:
    """Anthropic Messages (`/v1/messages`)."""

    name: str = "Anthropic Messages"

    def chat_request(self, body: ConversationRequest, scope: str) -> ChatRequest:
        """Messages, or what a token count is asked for."""
        return anthropic.chat_request(body, scope)

    def stream(self, body: MessagesRequest, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        return anthropic.message_events(events, body.model)

    def whole(self, body: MessagesRequest, events: list[ChatEvent]) -> dict[str, Any]:
        return anthropic.message_of(events, body.model)

    def error_body(self, failure: BadRequest) -> dict[str, Any]:
        return anthropic.error_body(failure)

    def error_event(self, failure: BadRequest) -> bytes:
        return anthropic.error_event(failure)


@dataclass(frozen=True, slots=True)
class _Responses:
    """OpenAI Responses (`/v1/responses`)."""

    name: str = "OpenAI Responses"

    def chat_request(self, body: ResponsesRequest, scope: str) -> ChatRequest:
        return responses.chat_request(body, scope)

    def stream(self, body: ResponsesRequest, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        return responses_output.ResponseEvents(body).events(events)

    def whole(self, body: ResponsesRequest, events: list[ChatEvent]) -> dict[str, Any]:
        return responses_output.response_of(events, body)

    def error_body(self, failure: BadRequest) -> dict[str, Any]:
        return _openai_error_body(failure)

    def error_event(self, failure: BadRequest) -> bytes:
        return responses.error_event(failure)


@dataclass(frozen=True, slots=True)
class _ChatCompletions:
    """OpenAI Chat Completions with tools (`/v1/chat/completions`, the requests the engine serves)."""

    name: str = "OpenAI Chat Completions"

    def chat_request(self, body: ChatCompletionRequest, scope: str) -> ChatRequest:
        return chat_completions.chat_request(body, scope)

    def stream(self, body: ChatCompletionRequest, events: AsyncIterator[ChatEvent]) -> AsyncIterator[bytes]:
        return chat_completions.CompletionChunks(body).events(events)

    def whole(self, body: ChatCompletionRequest, events: list[ChatEvent]) -> dict[str, Any]:
        return chat_completions.completion_of(events, body)

    def error_body(self, failure: BadRequest) -> dict[str, Any]:
        return _openai_error_body(failure)

    def error_event(self, failure: BadRequest) -> bytes:
        return chat_completions.error_event(failure)


MESSAGES = _Messages()
RESPONSES: Dialect[ResponsesRequest] = _Responses()
CHAT_COMPLETIONS: Dialect[ChatCompletionRequest] = _ChatCompletions()
