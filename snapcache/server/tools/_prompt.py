"""A chat template rendered the way llama-cpp-python's Jinja2ChatFormatter renders it, tools included."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from snapcache.errors import SnapcacheError
from snapcache.server.tools._messages import CallsAsText, render_messages
from snapcache.server.tools._values import ToolSpec


class ChatTemplateError(SnapcacheError, ValueError):
    """A chat template refused the conversation (its `raise_exception`) or could not be rendered."""


class _IgnoreGeneration(jinja2.ext.Extension):
    """Transformers' `{% generation %}` tag, rendered as its body (as llama-cpp-python does)."""

    # The extension API reads a mutable class attribute.
    tags = {"generation"}  # noqa: RUF012

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Transformers' and llama-cpp-python's `tojson`: non-ASCII kept, no HTML escaping.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _strftime_now(pattern: str) -> str:
    return datetime.now().strftime(pattern)


@lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_IgnoreGeneration, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    return environment.from_string(template)


def _tool_list(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI function tools from dicts already in that shape or from objects like ToolSpec."""
    listed = []
    for tool in tools:
        if isinstance(tool, Mapping):
            listed.append(dict(tool))
        else:
            listed.append(ToolSpec(tool.name, tool.description, dict(tool.parameters)).openai())
    return listed


def render_prompt(
    template: str,
    bos: str,
    eos: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
    *,
    calls_as_text: CallsAsText | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text `template` makes of `messages` (mapped by `render_messages`) and `tools`.

    Rendered as llama-cpp-python's Jinja2ChatFormatter does (sandboxed environment, `trim_blocks`,
    `lstrip_blocks`, its `tojson`, `raise_exception`, `strftime_now`, `tools` as OpenAI function
    tools), so a chat without tools gives the same text. `tools` are OpenAI-shaped dicts or objects
    with `name`, `description` and `parameters` (such as ToolSpec); empty means none. Whether the
    template shows them is `tool_format_for(...).renders_tools`.
    `variables` adds template variables (e.g. `enable_thinking`). Raises ChatTemplateError when the
    template rejects the conversation.
    """
    try:
        return _compiled(template).render(
            messages=render_messages(messages, template, calls_as_text=calls_as_text),
            eos_token=eos,
            bos_token=bos,
            raise_exception=_raise_exception,
            add_generation_prompt=add_generation_prompt,
            functions=None,
            function_call=None,
            tools=_tool_list(tools) if tools else None,
            tool_choice=None,
            strftime_now=_strftime_now,
            **(variables or {}),
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"the chat template failed: {error}") from error
