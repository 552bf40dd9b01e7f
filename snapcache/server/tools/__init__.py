"""Tool calls in the model's own chat template: tools and results rendered, calls parsed per format.

`tool_format_for(template)` finds the format (Hermes/Qwen, Qwen3-Coder/Qwen3.5 XML, Seed-OSS,
Llama 3.x, Mistral, FunctionGemma, Gemma 4, or none); `ToolFormat.parse` and `ToolFormat.stream`
read replies detokenized with special tokens; `ToolFormat.grammar` holds a reply to calls;
`render_prompt` renders a conversation with tools through the template. `GenericCallStream` and
`parse_generic` read the generic JSON answer of templates without a format of their own. The values
(`ToolSpec`, `ToolCall`, `ToolCallDelta`, `ToolCallDropped`) are the server's one set: its dialects
and its chat engine pass these.
"""

from __future__ import annotations

from snapcache.server.tools._detect import NO_TOOL_FORMAT, renders_tools, tool_format_for
from snapcache.server.tools._format import ToolFormat
from snapcache.server.tools._generic import GenericCallStream, parse_generic
from snapcache.server.tools._grammar import schema_gbnf
from snapcache.server.tools._messages import (
    UnsupportedContent,
    content_text,
    default_calls_as_text,
    render_messages,
)
from snapcache.server.tools._prompt import ChatTemplateError, render_prompt
from snapcache.server.tools._stream import StreamItem, ToolCallStream, content_of
from snapcache.server.tools._values import (
    ParsedReply,
    ToolCall,
    ToolCallDelta,
    ToolCallDropped,
    ToolSpec,
    arguments_json,
    arguments_object,
    new_call_id,
)

__all__ = [
    "NO_TOOL_FORMAT",
    "ChatTemplateError",
    "GenericCallStream",
    "ParsedReply",
    "StreamItem",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallDropped",
    "ToolCallStream",
    "ToolFormat",
    "ToolSpec",
    "UnsupportedContent",
    "arguments_json",
    "arguments_object",
    "content_of",
    "content_text",
    "default_calls_as_text",
    "new_call_id",
    "parse_generic",
    "render_messages",
    "render_prompt",
    "renders_tools",
    "schema_gbnf",
    "tool_format_for",
]
