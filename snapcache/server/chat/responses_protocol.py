"""OpenAI Responses request models: what `/v1/responses` takes.

Fields the server has no use for (`reasoning`, `include`, `prompt_cache_key`, `metadata`, `store`,
`text`, `truncation`, ...) are accepted and ignored: every model allows extra fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

__all__ = [
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
    model_config = ConfigDict(extra="allow")


class ContentPart(_Lenient):
    """`input_text`, `output_text` (text is read); `input_image`, `input_file` and others (a 400)."""

    type: str
    text: str | None = None


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


class ToolItem(_Lenient):
    """A tool: `function` tools reach the prompt; other types (`web_search`, `namespace`, ...) are
    left out."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class FunctionChoice(_Lenient):
    type: Literal["function"]
    name: str


class ResponsesRequest(_Lenient):
    """`POST /v1/responses`."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ToolItem] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: StrictBool = False
    store: StrictBool | None = None
    # `previous_response_id` is not a field: a request that gives one is refused (see `responses`).
