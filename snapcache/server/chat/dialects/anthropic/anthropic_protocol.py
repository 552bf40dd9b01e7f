"""Anthropic Messages request models: what `/v1/messages` and its `count_tokens` take.

Fields the server has no use for (`thinking`, `context_management`, `output_config`, `metadata`,
`cache_control` on blocks, ...) are accepted and ignored: every model allows extra fields. Values
are taken as their JSON type says (strict: `false` is no number), as the schema documents them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from snapcache.server.checks import AS_JSON_INTEGER

__all__ = [
    "AssistantMessage",
    "ConversationRequest",
    "CountTokensRequest",
    "ImageBlock",
    "ImageSource",
    "MessageParam",
    "MessagesRequest",
    "ModeChoice",
    "NamedChoice",
    "SystemMessage",
    "TextBlock",
    "ToolChoiceParam",
    "ToolParam",
    "ToolResultBlock",
    "ToolUseBlock",
    "UserMessage",
]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Lenient):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ImageSource(_Lenient):
    """Where an image is: `base64` (its `media_type` and `data`) is read; `url` and `file` are a
    400 that says to send the bytes (the server fetches nothing)."""

    type: str
    media_type: str | None = None
    data: str | None = None


class ImageBlock(_Lenient):
    type: Literal["image"]
    source: ImageSource


ResultBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultBlock] | None = None
    is_error: StrictBool | None = None


class IgnoredBlock(_Lenient):
    """A block a reply of this server never holds and the prompt leaves out (thinking)."""

    type: Literal["thinking", "redacted_thinking"]


UserBlock = Annotated[TextBlock | ImageBlock | ToolResultBlock | IgnoredBlock, Field(discriminator="type")]
AssistantBlock = Annotated[TextBlock | ToolUseBlock | IgnoredBlock, Field(discriminator="type")]


class UserMessage(_Lenient):
    role: Literal["user"]
    content: str | list[UserBlock]


class AssistantMessage(_Lenient):
    role: Literal["assistant"]
    content: str | list[AssistantBlock]


class SystemMessage(_Lenient):
    """A system message among the messages (Claude Code sends one): folded into the system text."""

    role: Literal["system"]
    content: str | list[TextBlock]


MessageParam = Annotated[UserMessage | AssistantMessage | SystemMessage, Field(discriminator="role")]


class ToolParam(_Lenient):
    """A tool: a client tool has an `input_schema`; a server tool (a `type` such as
    `web_search_20250305`) is left out of the prompt."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ModeChoice(_Lenient):
    """Text or a call (`auto`), a call of any tool (`any`), or no call (`none`)."""

    type: Literal["auto", "any", "none"]
    disable_parallel_tool_use: StrictBool | None = None


class NamedChoice(_Lenient):
    """A call of the tool named, which must be among the request's tools."""

    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: StrictBool | None = None


ToolChoiceParam = Annotated[ModeChoice | NamedChoice, Field(discriminator="type")]


class ConversationRequest(_Lenient):
    """What a Messages request and a count_tokens request share."""

    model: str
    # At least one user or assistant message: system text alone is no conversation.
    messages: list[MessageParam] = Field(
        min_length=1,
        json_schema_extra={"contains": {"properties": {"role": {"enum": ["user", "assistant"]}}}},
    )
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None


class MessagesRequest(ConversationRequest):
    """`POST /v1/messages`."""

    max_tokens: Annotated[int, Field(ge=1), AS_JSON_INTEGER]
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: Annotated[int, Field(ge=0), AS_JSON_INTEGER] | None = None
    stream: StrictBool = False


class CountTokensRequest(ConversationRequest):
    """`POST /v1/messages/count_tokens`."""
