"""The one chat request every dialect becomes, with its messages in the shape templates take.

Every dialect (Anthropic Messages, OpenAI Responses, Chat Completions with tools, Ollama's) is
translated into a `ChatRequest` (see its module); `ChatEngine` runs it. Its messages are OpenAI
chat messages, normalized so that a template written for plain chats renders them: text only
(content-part lists joined; an image is a marker in the text, its bytes in the request's `images`,
see `sent_images`), one leading system message (`developer` messages and system messages
anywhere folded into it, in order), assistant tool calls as OpenAI `tool_calls` and their results
as `tool` messages. Tools and calls are the values of
`snapcache.server.tools` (`ToolSpec`, `ToolCall`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from snapcache.server.chat.sent_images import ImagePlaces, SentImage
from snapcache.server.error_answers import BadRequest
from snapcache.server.tools import ToolCall, ToolSpec, UnsupportedContent, content_text

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "NamedTool",
    "Sampling",
    "ToolChoice",
    "normalized_messages",
    "text_of",
]

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class NamedTool:
    """A `tool_choice` that names the tool to call (kept apart from the modes: a tool may be called
    "auto", "none" or "required")."""

    name: str


# "auto": text or a call; "required": a call; NamedTool: a call of that tool; "none": no tools.
ToolChoice = Literal["auto", "none", "required"] | NamedTool


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the answer's tokens are drawn, as `create_chat_completion` takes them (None: its default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    mirostat_mode: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    # Added to a token's logit before sampling, keyed by token id (as a decimal string) or, where
    # `logit_bias_type` is "tokens", by a text whose every token gets the bias (as llama-cpp-python's
    # server takes it).
    logit_bias: Mapping[str, float] | None = None
    logit_bias_type: Literal["input_ids", "tokens"] | None = None

    @classmethod
    def of(cls, source: Any) -> Sampling:
        """The settings a dialect's request model (pydantic) declares under these names, checked by
        it; a field it does not declare is never read, even where the client sent one."""
        declared = getattr(type(source), "model_fields", {})
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls) if f.name in declared})

    def settings(self) -> dict[str, Any]:
        """The settings given, as `create_chat_completion`'s keyword arguments (the logit bias apart:
        its keys may need the tokenizer, `ChatEngine` resolves them)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None and not f.name.startswith("logit_bias")
        }


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message: a role, its text, and for an assistant its calls, for a tool result the call's id."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def as_openai(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.openai() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What a dialect asks of the model, in one shape (see the module docstring)."""

    messages: tuple[ChatMessage, ...]
    max_tokens: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    # llama-cpp-python's: {"type": "json_object"}, with a JSON "schema" the answer must fit or not;
    # None for text. A dialect refuses it beside tools, whose grammar holds the answer already.
    response_format: Mapping[str, Any] | None = None
    # llama.cpp's GBNF the answer must fit (checked before it gets here); None: free text. A dialect
    # refuses it beside tools or a response format, which bring their own.
    grammar: str | None = None
    # The end of text is held back until this many tokens are generated (no grammar beside it).
    min_tokens: int = 0
    stream: bool = False
    scope: str = "default"
    # The images the messages' text holds `image_marker` in place of, in order (see `sent_images`).
    images: tuple[SentImage, ...] = ()
    image_marker: str = ""

    @staticmethod
    def images_of(places: ImagePlaces) -> dict[str, Any]:
        """The keyword arguments that give a request the images a dialect placed (none: no images)."""
        if not places.images:
            return {}
        return {"images": tuple(places.images), "image_marker": places.marker}

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def text_of(content: Any, where: str) -> str:
    """The text of a message's content: a string, or a list of text parts joined by newlines (other
    parts: BadRequest naming `where`)."""
    try:
        return content_text(content, separator="\n", strict=True)
    except UnsupportedContent as exc:
        raise BadRequest(f"{where}: {exc}", param=where) from None


def normalized_messages(messages: Iterable[ChatMessage]) -> tuple[ChatMessage, ...]:
    """One leading system message holding every system text in order, then the rest.

    Checks that every tool result answers a call made before it (BadRequest otherwise): a result
    without its call is a request no template renders faithfully.
    """
    system: list[str] = []
    rest: list[ChatMessage] = []
    called: set[str] = set()
    for message in messages:
        if message.role == "system":
            if message.content:
                system.append(message.content)
            continue
        if message.role == "tool" and message.tool_call_id not in called:
            raise BadRequest(
                f"a tool result answers call {message.tool_call_id!r}, which no earlier assistant "
                "message made",
                param="messages",
            )
        called.update(call.id for call in message.tool_calls)
        rest.append(message)
    if not rest:
        raise BadRequest("the request holds no message besides system text", param="messages")
    head = (ChatMessage("system", "\n\n".join(system)),) if system else ()
    return (*head, *rest)
