"""OpenAI Chat Completions request models: what `/v1/chat/completions` takes.

OpenAI's fields, the legacy `functions` and `function_call` among them, and llama-cpp-python's own
(`grammar`, `min_tokens`, `mirostat_*`, `logit_bias_type`, `top_k`, `repeat_penalty`), so that
what its server took is taken here. Fields are taken as their JSON type says (strict: `false` is no
number; 2.0 is an integer, as in JSON Schema). Every model allows extra fields: what the server has
no use for (`user`, `metadata`, `store`, `service_tier`, `prompt_cache_key`, ...) is accepted and
ignored. `parsed` turns a body into a request or a BadRequest that names the first field at fault.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from snapcache.server.checks import AS_JSON_INTEGER
from snapcache.server.error_answers import BadRequest

__all__ = [
    "ChatCompletionRequest",
    "ContentPart",
    "FunctionCall",
    "FunctionDefinition",
    "JsonSchema",
    "Message",
    "NamedToolChoice",
    "ResponseFormat",
    "StreamOptions",
    "Tool",
    "ToolCall",
    "parsed",
]


class _Lenient(BaseModel):
    # Strict, as the schema documents the fields (`true` is no number), ints read as JSON's integer.
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class ContentPart(_Lenient):
    """`text` parts are read (and an assistant's `refusal`), and a user's `image_url` (a data URL:
    the server fetches nothing); audio and files are a 400."""

    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: str | dict[str, Any] | None = None


class FunctionCall(_Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Lenient):
    """A call an earlier assistant turn made."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Lenient):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Lenient):
    """A tool: `function` tools reach the prompt; other types (`custom`, ...) are left out."""

    type: str
    function: FunctionDefinition | None = None


class _ChosenFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: _ChosenFunction


class _ChosenFunctionCall(_Lenient):
    """A legacy `function_call` naming the function to call."""

    name: str


class JsonSchema(_Lenient):
    """OpenAI's structured output: the schema the answer must fit."""

    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Lenient):
    """`text`; `json_object`, with llama-cpp-python's `schema` or without; or OpenAI's `json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    json_schema: JsonSchema | None = None


class StreamOptions(_Lenient):
    include_usage: StrictBool | None = None


class ChatCompletionRequest(_Lenient):
    """`POST /v1/chat/completions`, as the engine serves it."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    # As for plain chats on this route: a max_tokens of 0 or less sets no limit (the server's cap).
    max_tokens: Annotated[int, AS_JSON_INTEGER] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1), AS_JSON_INTEGER] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: Annotated[int, Field(ge=0), AS_JSON_INTEGER] | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    typical_p: float | None = Field(default=None, gt=0, le=1)
    repeat_penalty: float | None = Field(default=None, ge=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stop: str | list[str] | None = None
    seed: Annotated[int, AS_JSON_INTEGER] | None = None
    n: Annotated[int, Field(ge=1), AS_JSON_INTEGER] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), AS_JSON_INTEGER] | None = None
    response_format: ResponseFormat | None = None
    # The legacy way to offer tools (it wins over `tools`, as llama-cpp-python's server has it).
    functions: list[FunctionDefinition] | None = None
    function_call: Literal["none", "auto"] | _ChosenFunctionCall | None = None
    # llama-cpp-python's: token ids (or, with logit_bias_type "tokens", texts) to a bias.
    logit_bias: dict[str, float] | None = None
    logit_bias_type: Literal["input_ids", "tokens"] | None = None
    grammar: str | None = None
    min_tokens: Annotated[int, Field(ge=0), AS_JSON_INTEGER] = 0
    mirostat_mode: Annotated[int, Field(ge=0, le=2), AS_JSON_INTEGER] | None = None
    mirostat_tau: float | None = Field(default=None, ge=0, le=10)
    mirostat_eta: float | None = Field(default=None, ge=0.001, le=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None


def parsed(document: dict[str, Any]) -> ChatCompletionRequest:
    """`document` as a request, or BadRequest naming the first field that is not what it must be."""
    try:
        return ChatCompletionRequest.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or None
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = f"{where or 'request'}: {first.get('msg', 'invalid value')}{more}"
        raise BadRequest(message, param=where) from None
