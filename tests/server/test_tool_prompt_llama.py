"""render_prompt gives llama-cpp-python's own prompt: through its Jinja2ChatFormatter, and on a GGUF whose
metadata carries a Hermes-style template."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_model
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from snapcache.llama.templates.chat_templates import GEMMA3_TEMPLATE
from snapcache.server.tools import ToolSpec, render_messages, render_prompt, tool_format_for

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "chat_templates"
REAL = sorted(path.name for path in TEMPLATES.glob("*.jinja"))

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Capital of France?"},
]
TOOLS = [
    ToolSpec("lookup", "Look a word up.", {"type": "object", "properties": {"word": {"type": "string"}}})
]
WITH_TOOLS = [
    {"role": "user", "content": "Define cat."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "abcdefgh1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"word": "cat"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "abcdefgh1", "content": "a small feline"},
    {"role": "assistant", "content": "A small feline."},
    {"role": "user", "content": "Dog?"},
]


def formatter_prompt(template: str, messages: list[dict[str, object]], **kwargs: object) -> str:
    return Jinja2ChatFormatter(template, eos_token="</s>", bos_token="<s>")(
        messages=messages, **kwargs
    ).prompt


@pytest.mark.parametrize("name", [*REAL, "gemma3", "tiny"])
def test_a_chat_without_tools_renders_as_llama_cpp_python_renders_it(name: str) -> None:
    template = {"gemma3": GEMMA3_TEMPLATE, "tiny": tiny_model.CHAT_TEMPLATE}.get(name)
    template = template or (TEMPLATES / name).read_text()
    assert render_prompt(template, "<s>", "</s>", CHAT) == formatter_prompt(template, CHAT)


@pytest.mark.parametrize(
    "name", [name for name in REAL if tool_format_for((TEMPLATES / name).read_text()).native]
)
def test_a_chat_with_tools_renders_as_the_formatter_renders_the_mapped_messages(name: str) -> None:
    template = (TEMPLATES / name).read_text()
    expected = formatter_prompt(
        template, render_messages(WITH_TOOLS, template), tools=[t.openai() for t in TOOLS]
    )
    assert render_prompt(template, "<s>", "</s>", WITH_TOOLS, TOOLS) == expected


@pytest.mark.model
def test_a_gguf_with_a_hermes_template_gets_the_same_prompt_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_llama
) -> None:
    template = (TEMPLATES / "qwen2.5-7b-instruct.jinja").read_text()
    monkeypatch.setattr(tiny_model, "CHAT_TEMPLATE", template)  # read when the vocabulary is written
    path = tiny_model.write_tiny_llama(tmp_path / "hermes.gguf")
    llm = make_llama(path)
    assert llm.metadata["tokenizer.chat_template"] == template
    assert tool_format_for(llm.metadata["tokenizer.chat_template"]).name == "hermes"
    messages = CHAT[1:]  # the Qwen default system text keeps the prompt short on a byte vocabulary
    prompt = render_prompt(template, "<s>", "</s>", messages)
    tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    llm.create_chat_completion(messages=messages, max_tokens=1)
    assert llm.n_tokens in (len(tokens), len(tokens) + 1)  # the prompt, then perhaps the sampled token
    assert list(llm.input_ids[: len(tokens)]) == tokens
