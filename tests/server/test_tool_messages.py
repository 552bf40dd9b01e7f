"""Messages mapped for what a template knows: roles, content parts, calls, results, one call per turn."""

from __future__ import annotations

import json

import pytest

from snapcache.llama.templates.chat_templates import GEMMA3_TEMPLATE
from snapcache.server.chat.chat_request import text_of
from snapcache.server.error_answers import BadRequest
from snapcache.server.tools import (
    ChatTemplateError,
    ToolCall,
    ToolSpec,
    UnsupportedContent,
    content_text,
    render_messages,
    render_prompt,
    tool_format_for,
)

# A template that knows tool calls, the tool role and developer messages by name.
TOOL_AWARE = "{% for m in messages %}{{ m.role }}{{ m.tool_calls }}{% endfor %}{# 'tool' 'developer' #}"
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}


def test_content_parts_become_text() -> None:
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "input_text", "text": "b"},
        "c",
    ]
    assert content_text(parts) == "abc"
    assert content_text(None) == ""
    (message,) = render_messages([{"role": "user", "content": parts}], GEMMA3_TEMPLATE)
    assert message == {"role": "user", "content": "abc"}


def test_strict_content_refuses_what_is_not_text() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "output_text", "text": "b"}, "c"]
    assert content_text(parts, separator="\n", strict=True) == "a\nb\nc"
    with pytest.raises(UnsupportedContent, match="'image_url' is not supported"):
        content_text([*parts, {"type": "image_url", "image_url": {"url": "x"}}], strict=True)
    with pytest.raises(UnsupportedContent, match="a string or a list of text parts"):
        content_text({"text": "a"}, strict=True)
    # A request's content, as the dialects read it: the same rules, the error naming where it was.
    assert text_of(parts, "messages.0.content") == "a\nb\nc"
    with pytest.raises(BadRequest, match=r"^messages\.0\.content: content of type 'image'") as refused:
        text_of([{"type": "image"}], "messages.0.content")
    assert refused.value.param == "messages.0.content"


def test_developer_becomes_system_and_leading_system_messages_become_one() -> None:
    messages = [
        {"role": "developer", "content": "A"},
        {"role": "system", "content": "B"},
        {"role": "user", "content": "hi"},
    ]
    assert render_messages(messages, GEMMA3_TEMPLATE) == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "hi"},
    ]
    assert render_messages(messages[:1], TOOL_AWARE) == [{"role": "developer", "content": "A"}]


def test_calls_carry_object_arguments_and_results_their_call_name() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "found"}]},
        {"role": "assistant", "content": "done"},
    ]
    mapped = render_messages(messages, TOOL_AWARE)
    assert mapped[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
        ],
    }
    assert mapped[2] == {"role": "tool", "content": "found", "tool_call_id": "call_1", "name": "lookup"}
    assert "tool_calls" not in mapped[3]  # Llama's templates test `'tool_calls' in message`


def test_call_objects_and_unparsable_arguments_are_taken() -> None:
    messages = [{"role": "assistant", "content": "", "tool_calls": [ToolCall("c9", "f", "not json")]}]
    (mapped,) = render_messages(messages, TOOL_AWARE)
    assert mapped["tool_calls"][0]["function"] == {"name": "f", "arguments": "not json"}


def test_without_a_tool_role_results_become_wrapped_user_text() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        {"role": "user", "content": "and?"},
    ]
    mapped = render_messages(messages, GEMMA3_TEMPLATE)
    assert [m["role"] for m in mapped] == ["user", "assistant", "user"]  # roles still alternate
    assert mapped[1]["content"] == 'Looking.\n{"tool_calls": [{"name": "lookup", "arguments": {"q": "x"}}]}'
    assert (
        mapped[2]["content"] == '<tool_response name="lookup" id="call_1">\nfound\n</tool_response>\n\nand?'
    )
    custom = render_messages(messages, GEMMA3_TEMPLATE, calls_as_text=lambda calls: f"<<{calls[0].name}>>")
    assert custom[1]["content"] == "Looking.\n<<lookup>>"
    prompt = render_prompt(GEMMA3_TEMPLATE, "<bos>", "<eos>", messages)
    assert prompt.count("<start_of_turn>user") == 2
    assert not tool_format_for(GEMMA3_TEMPLATE).renders_tools


def test_one_call_per_turn_puts_each_result_after_its_call() -> None:
    template = (
        "{{ raise_exception('This model only supports single tool-calls at once!') }}{# 'tool' tool_calls #}"
    )
    calls = [CALL, {**CALL, "id": "call_2", "function": {"name": "other", "arguments": "{}"}}]
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Two.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_2", "content": "second"},
        {"role": "tool", "tool_call_id": "call_1", "content": "first"},
        {"role": "tool", "tool_call_id": "call_x", "content": "stray"},
    ]
    mapped = render_messages(messages, template)
    assert [(m["role"], m["content"]) for m in mapped] == [
        ("user", "q"),
        ("assistant", "Two."),
        ("tool", "first"),
        ("assistant", ""),
        ("tool", "second"),
        ("tool", "stray"),
    ]
    assert [m["tool_calls"][0]["id"] for m in mapped if m["role"] == "assistant"] == ["call_1", "call_2"]


def test_a_template_refusal_is_a_chat_template_error() -> None:
    template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ChatTemplateError, match="roles must alternate") as caught:
        render_prompt(template, "", "", [{"role": "user", "content": "x"}])
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ChatTemplateError, match="failed"):
        render_prompt("{{ messages[5].content.x }}", "", "", [{"role": "user", "content": "x"}])


def test_tools_are_passed_in_openai_shape() -> None:
    template = "{{ tools | tojson }}"
    spec = ToolSpec("f", "does f", {"type": "object", "properties": {"é": {"type": "string"}}})
    rendered = render_prompt(template, "", "", [{"role": "user", "content": "x"}], [spec])
    assert json.loads(rendered) == [spec.openai()]
    assert "é" in rendered  # tojson keeps non-ASCII, as llama-cpp-python's does
    assert render_prompt(template, "", "", [{"role": "user", "content": "x"}], []) == "null"
