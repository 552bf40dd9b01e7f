"""Ollama API request models: what `/api/chat`, `/api/generate` and `/api/show` take.

As Ollama reads them: `stream` is true unless set false; `options` holds the sampling settings
(the load-time ones, such as `num_ctx` or `num_gpu`, belong to how the server was started and are
accepted and ignored, as are `keep_alive` and `think`). Values are taken as their JSON type says
(strict: `false` is no number; no NaN or infinity, which no sampler takes); every model allows
extra fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from snapcache.server.checks import AS_JSON_INTEGER

__all__ = [
    "ChatBody",
    "FunctionCall",
    "GenerateBody",
    "Message",
    "Options",
    "ShowBody",
    "Tool",
    "ToolCall",
]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class Options(_Lenient):
    """The sampling settings of a request (Ollama's runtime options)."""

    num_predict: Annotated[int, AS_JSON_INTEGER] | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: Annotated[int, Field(ge=0), AS_JSON_INTEGER] | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    typical_p: float | None = Field(default=None, gt=0, le=1)
    repeat_penalty: float | None = Field(default=None, ge=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: Annotated[int, AS_JSON_INTEGER] | None = None
    stop: list[str] | str | None = None


class FunctionCall(_Lenient):
    name: str
    # An object, as Ollama writes one; JSON text of one is taken too.
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(_Lenient):
    """A call an earlier assistant turn made; `id` where the client kept the one it was given."""

    id: str | None = None
    function: FunctionCall


class Message(_Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    # A tool result names the call it answers by the tool's name (Ollama's) or by its id.
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Function(_Lenient):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Lenient):
    type: str = "function"
    function: _Function | None = None


class _Request(_Lenient):
    model: str = ""
    stream: StrictBool = True
    # How long the model stays loaded: it always does here; 0 with no messages asks to unload it.
    keep_alive: float | str | None = None
    options: Options | None = None
    # "json" (any JSON object) or a JSON schema the answer must fit; "" or none: text.
    format: Literal["", "json"] | dict[str, Any] | None = None


class ChatBody(_Request):
    """`POST /api/chat`. No messages: the model is loaded, and the answer says so."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateBody(_Request):
    """`POST /api/generate`. No prompt: the model is loaded, and the answer says so."""

    prompt: str = ""
    system: str | None = None
    suffix: str | None = None
    template: str | None = None
    raw: StrictBool = False
    context: list[Any] | None = None
    images: list[Any] | None = None


class ShowBody(_Lenient):
    """`POST /api/show`: `model` (older clients send `name`)."""

    model: str | None = None
    name: str | None = None
    verbose: StrictBool = False
