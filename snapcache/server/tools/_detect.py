"""Which call format a GGUF's Jinja chat template teaches its model."""

from __future__ import annotations

import re
from functools import lru_cache

import jinja2
import jinja2.meta

from snapcache.server.tools._format import ToolFormat
from snapcache.server.tools._gemma import FUNCTION_GEMMA, GEMMA4
from snapcache.server.tools._hermes import HermesSyntax
from snapcache.server.tools._llama3 import Llama3Syntax
from snapcache.server.tools._mistral import MistralSyntax
from snapcache.server.tools._qwen_xml import QwenXmlSyntax

NO_TOOL_FORMAT = ToolFormat("none")

# Inside `<tool_call>`, the Hermes format writes a JSON object with "name" and "arguments"; GLM, Ling,
# Laguna, MiniMax and Qwen3-Coder write XML or a bare name there instead; Apriel lists its calls in
# `<tool_calls>`.
_NOT_HERMES = ("<arg_key>", "<function=", "<invoke", "<parameter=", "<tool_calls>")
_ARGUMENTS_KEY = re.compile(r'\\?"arguments\\?"')


def renders_tools(template: str) -> bool:
    """Whether the template reads the `tools` variable (so it places the tools in the prompt)."""
    try:
        names = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:
        return re.search(r"\btools\b", template) is not None
    return "tools" in names or "custom_tools" in names


@lru_cache(maxsize=32)
def tool_format_for(template: str | None) -> ToolFormat:
    """The call format of the model whose chat template this is; "none" for unknown or no template.

    Checked most specific first. Templates that write `<tool_call>` with other XML inside (GLM,
    MiniMax) or `<function=...>` calls without it (Functionary) are not these formats and are left
    to the caller's fallback.
    """
    if not template:
        return NO_TOOL_FORMAT
    renders = renders_tools(template)
    if "<start_function_call>" in template:
        return ToolFormat("functiongemma", renders, ("<start_function_response>",), FUNCTION_GEMMA)
    if "<|tool_call>" in template and "call:" in template:
        return ToolFormat("gemma4", renders, ("<|tool_response>",), GEMMA4)
    if "[TOOL_CALLS]" in template:
        syntax = MistralSyntax(named="[ARGS]" in template, call_ids="[CALL_ID]" in template)
        return ToolFormat("mistral", renders, (), syntax)
    if "<seed:tool_call>" in template and "<parameter=" in template:
        return ToolFormat("seed_oss", renders, (), QwenXmlSyntax("<seed:tool_call>", "</seed:tool_call>"))
    if "<tool_call>" in template and "<function=" in template and "<parameter=" in template:
        return ToolFormat("qwen3_coder", renders, (), QwenXmlSyntax())
    if (
        "<tool_call>" in template
        and _ARGUMENTS_KEY.search(template)
        and not any(other in template for other in _NOT_HERMES)
    ):
        return ToolFormat("hermes", renders, (), HermesSyntax())
    if "<|start_header_id|>" in template and '"parameters"' in template and "<function=" not in template:
        return ToolFormat("llama3", renders, (), Llama3Syntax())
    return ToolFormat("none", renders)
