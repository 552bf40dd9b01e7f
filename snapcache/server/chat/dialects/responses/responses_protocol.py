"""OpenAI Responses request models: what `/v1/responses` takes.

Fields the server has no use for (`reasoning`, `include`, `prompt_cache_key`, `metadata`, `store`,
`text`, `truncation`, ...) are accepted and ignored: every model allows extra fields. Values are
taken as their JSON type says (strict: `false` is no number), as the schema documents them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from snapcache.server.checks import AS_JSON_INTEGER

__all__ = [
    "TEXT_PARTS",
    "ContentPart",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "FunctionChoice",
    "InputMessage",
    "ResponsesRequest",
    "SkippedItem",
    "ToolItem",
]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ContentPart(_Lenient):
    """`input_text`, `output_text` (text is read); `input_image` with its `image_url` a data URL (the
    server fetches nothing), in a user message or a function's output, where the model is served
    with its projector; `input_file` and others (a 400 that names the part: the model takes any
    type, and the schema documents the text parts, and images where the server reads them)."""

    model_config = ConfigDict(
        json_schema_extra={
            "properties": {"type": {"enum": list(TEXT_PARTS)}, "text": {"type": "string"}},
            "required": ["type", "text"],
        }
    )

    type: str
    text: str | None = None
    image_url: str | None = None


class InputMessage(_Lenient):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


class SkippedItem(_Lenient):
    """Items a stateless answer leaves out of the prompt (an earlier answer's reasoning)."""

    type: Literal["reasoning", "item_reference"]


InputItem = FunctionCallItem | FunctionCallOutputItem | SkippedItem | InputMessage
# A conversation needs a turn besides system text: a user or assistant message, or a call.
_A_TURN = {
    "anyOf": [
        {
            "type": "object",
            "required": ["role"],
            "properties": {"role": {"enum": ["user", "assistant"]}, "type": {"const": "message"}},
        },
        {"type": "object", "required": ["type"], "properties": {"type": {"const": "function_call"}}},
    ]
}
InputItems = Annotated[list[InputItem], Field(json_schema_extra={"contains": _A_TURN})]


class ToolItem(_Lenient):
    """A tool: `function` tools reach the prompt; other types (`web_search`, `namespace`, ...) are
    left out."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class FunctionChoice(_Lenient):
    """A call of the function named, which must be among the request's function tools."""

    type: Literal["function"]
    name: str = Field(min_length=1)


class ResponsesRequest(_Lenient):
    """`POST /v1/responses`."""

    model: str | None = None
    input: str | InputItems
    instructions: str | None = None
    tools: list[ToolItem] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: Annotated[int, Field(ge=1), AS_JSON_INTEGER] | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: StrictBool = False
    store: StrictBool | None = None
    # `previous_response_id` is not a field: a request that gives one is refused (see `responses`).
