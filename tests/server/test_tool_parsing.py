"""Replies in each model's own call format, parsed whole and streamed: calls, content, malformed calls."""

from __future__ import annotations

import json

import pytest

from snapcache.server.tools import (
    ParsedReply,
    ToolCall,
    ToolCallDelta,
    ToolCallDropped,
    ToolFormat,
    ToolSpec,
    content_of,
    tool_format_for,
)

# The smallest template text each format is detected from; the real templates are in
# test_tool_templates.py.
DETECTED_BY = {
    "hermes": '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>",
    "seed_oss": "<seed:tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>",
    "llama3": '<|start_header_id|>{"name": function name, "parameters": dictionary}',
    "mistral": "[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]",
    "functiongemma": "{{ tools }}<start_function_call>call:",
    "gemma4": "{{ tools }}<|tool_call>call:",
}


def fmt(name: str) -> ToolFormat:
    found = tool_format_for(DETECTED_BY[name])
    assert found.name == name
    return found


def calls_of(reply: ParsedReply) -> list[tuple[str, dict[str, object]]]:
    return [(call.name, json.loads(call.arguments)) for call in reply.calls]


def streamed(form: ToolFormat, deltas: list[str]) -> tuple[str, list[ToolCall], list[object]]:
    stream = form.stream()
    items: list[object] = []
    for delta in deltas:
        items.extend(stream.feed(delta))
    items.extend(stream.finish())
    content = "".join(content_of(item) for item in items)  # as a whole reply shows it
    return content, [item for item in items if isinstance(item, ToolCall)], items


WEATHER = ("get_weather", {"city": "Paris"})
TIME = ("get_time", {"city": "Paris", "utc": True})

# (format, reply as detokenized with special tokens, expected content, expected calls)
CASES = [
    (
        "hermes",
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Checking.",
        [WEATHER],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris", "utc": true}}\n</tool_call>',
        "",
        [WEATHER, TIME],
    ),
    # Hermes-2-Pro writes the arguments first; a reply cut after the object still holds the call.
    ("hermes", '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}', "", [WEATHER]),
    (
        "qwen3_coder",
        "Let me see.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=utc>\ntrue\n</parameter>\n</function>\n</tool_call>",
        "Let me see.",
        [WEATHER, TIME],
    ),
    (
        "seed_oss",
        "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n"
        "</seed:tool_call>",
        "",
        [WEATHER],
    ),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [WEATHER]),
    (
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"city": "Paris", "utc": true}}<|eom_id|>',
        "",
        [WEATHER, TIME],
    ),
    (
        "llama3",
        'Let me look. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "Let me look.",
        [WEATHER],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
        '{"name": "get_time", "arguments": {"city": "Paris", "utc": true}}]',
        "",
        [WEATHER, TIME],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris", "utc": true}',
        "Sure.",
        [WEATHER, TIME],
    ),
    (
        "functiongemma",
        "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>"
        "<start_function_call>call:get_time{city:<escape>Paris<escape>,utc:true}<end_function_call>"
        "<start_function_response>",
        "",
        [WEATHER, TIME],
    ),
    (
        "gemma4",
        'One moment.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        "One moment.",
        [WEATHER],
    ),
]


@pytest.mark.parametrize(("name", "reply", "content", "calls"), CASES)
def test_reply_parses_into_content_and_calls(name, reply, content, calls) -> None:
    parsed = fmt(name).parse(reply)
    assert parsed.content == content
    assert calls_of(parsed) == calls
    assert all(
        call.arguments == json.dumps(args, separators=(",", ":"))
        for call, (_, args) in zip(parsed.calls, calls, strict=True)
    )


@pytest.mark.parametrize(("name", "reply", "content", "calls"), CASES)
@pytest.mark.parametrize("size", [1, 2, 5])
def test_streamed_reply_gives_the_same_calls_at_any_split(name, reply, content, calls, size) -> None:
    deltas = [reply[i : i + size] for i in range(0, len(reply), size)]
    text, made, items = streamed(fmt(name), deltas)
    assert text.strip() == content
    assert [(call.name, json.loads(call.arguments)) for call in made] == calls
    # Every call announced is made, under the id it was announced with.
    announced = {item.id for item in items if isinstance(item, ToolCallDelta)}
    assert announced <= {call.id for call in made}
    assert not [item for item in items if isinstance(item, ToolCallDropped)]


def test_ids_are_the_models_where_its_format_has_them_else_fresh() -> None:
    parsed = fmt("mistral").parse(
        '[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "a1b2c3d4e"}, {"name": "g", "arguments": {}}]'
    )
    assert parsed.calls[0].id == "a1b2c3d4e"
    fresh = parsed.calls[1].id
    assert fresh.startswith("call_")
    assert len(fresh) == 29
    int(fresh[5:], 16)
    again = fmt("hermes").parse('<tool_call>{"name": "f", "arguments": {}}</tool_call>' * 2)
    assert again.calls[0].id != again.calls[1].id


@pytest.mark.parametrize(
    ("name", "reply"),
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par</tool_call>'),
        ("hermes", '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>'),  # no name
        ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": '),
        ("llama3", '{"answer": 42}'),  # JSON, but no call: plain content
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]not json"),
        ("functiongemma", "<start_function_call>call:get_weather{city:<escape>Paris}<end_function_call>"),
        ("functiongemma", "<start_function_call>get_weather{}<end_function_call>"),
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\nstray text</tool_call>"),
        ("qwen3_coder", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'),
    ],
)
def test_a_malformed_call_stays_content(name, reply) -> None:
    parsed = fmt(name).parse(reply)
    assert parsed.calls == ()
    assert parsed.content == reply
    text, made, items = streamed(fmt(name), list(reply))
    assert (text, made) == (reply, [])
    # A call the stream announced is dropped under its id, never left open.
    announced = {item.id for item in items if isinstance(item, ToolCallDelta)}
    assert announced == {item.id for item in items if isinstance(item, ToolCallDropped)}


def test_a_malformed_call_between_good_ones_is_kept_as_text() -> None:
    reply = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{oops}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    )
    parsed = fmt("hermes").parse(reply)
    assert [call.name for call in parsed.calls] == ["a", "b"]
    assert parsed.content == "<tool_call>{oops}</tool_call>"


def test_text_without_calls_comes_back_unchanged() -> None:
    reply = "  Paris is sunny. A tag such as <tool or [TOOL_ or <start_function is just text.\n"
    for name in DETECTED_BY:
        assert fmt(name).parse(reply) == ParsedReply(reply, ())
        assert streamed(fmt(name), list(reply))[:2] == (reply, [])


def test_no_native_format_reads_everything_as_content() -> None:
    for template in (None, "", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"):
        form = tool_format_for(template)
        assert (form.name, form.native) == ("none", False)
        reply = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
        assert form.parse(reply) == ParsedReply(reply, ())


def test_stream_holds_back_a_marker_split_across_deltas() -> None:
    stream = fmt("mistral").stream()
    assert stream.feed("It is ") == ["It is"]  # the space may precede a call: held
    assert stream.feed("sunny. [TOOL") == [" sunny."]
    assert stream.feed("_CA") == []
    assert stream.feed("LLS]get_wea") == []
    opened, first = stream.feed('ther[ARGS]{"city": "Pa')
    assert isinstance(opened, ToolCallDelta)
    assert isinstance(first, ToolCallDelta)
    assert (opened.index, opened.name, opened.arguments, first.arguments) == (
        0,
        "get_weather",
        "",
        '{"city": "Pa',
    )
    rest, call = stream.feed('ris"}')
    assert rest == ToolCallDelta(0, opened.id, "get_weather", 'ris"}')
    assert call == ToolCall(opened.id, "get_weather", '{"city":"Paris"}')
    assert stream.finish() == []


def test_stream_gives_each_call_as_it_closes() -> None:
    stream = fmt("hermes").stream()
    first = stream.feed('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", ')
    assert [call.name for call in first if isinstance(call, ToolCall)] == ["a"]
    second = stream.feed('"arguments": {}}</tool_call>')
    assert [call.name for call in second if isinstance(call, ToolCall)] == ["b"]
    assert stream.finish() == []
    assert [call.name for call in stream.calls] == ["a", "b"]


@pytest.mark.parametrize(("name", "reply", "content", "calls"), CASES)
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_argument_deltas_add_up_to_the_calls_arguments(name, reply, content, calls, size) -> None:
    _, made, items = streamed(fmt(name), [reply[i : i + size] for i in range(0, len(reply), size)])
    deltas = [item for item in items if isinstance(item, ToolCallDelta)]
    for index, call in enumerate(made):
        mine = [delta for delta in deltas if delta.index == index]
        if not mine:
            continue  # a format or call that is not streamed comes whole
        assert items.index(mine[-1]) < items.index(call)
        assert {(delta.id, delta.name) for delta in mine} == {(call.id, call.name)}
        assert mine[0].arguments == ""
        assert json.loads("".join(delta.arguments for delta in mine)) == json.loads(call.arguments)
    streams = {"hermes": 1, "llama3": 1, "mistral": 1}.get(name, 0)
    if name == "mistral" and reply.startswith("[TOOL_CALLS]["):
        streams = 0  # a JSON list of calls comes whole
    if name == "mistral" and "[ARGS]" in reply:
        streams = len(calls)
    if name == "hermes":
        streams = sum('{"name"' in part for part in reply.split("<tool_call>")[1:])
    assert len({delta.index for delta in deltas}) == streams


def test_llama_bare_json_is_held_until_it_is_known_to_be_a_call() -> None:
    stream = fmt("llama3").stream()
    assert stream.feed("  ") == []
    opened, first = stream.feed('{"name": "get_weather", "parameters": {"ci')
    assert (opened.name, first.arguments) == ("get_weather", '{"ci')  # type: ignore[union-attr]
    assert [item.arguments for item in stream.feed('ty": "Paris"}}')] == ['ty": "Paris"}']  # type: ignore[union-attr]
    (call,) = stream.finish()  # more calls may follow until the reply ends
    assert isinstance(call, ToolCall)
    assert call.name == "get_weather"
    plain = fmt("llama3").stream()
    assert plain.feed("Hello {there}") == ["Hello {there}"]


def test_arguments_are_normalized_to_compact_json() -> None:
    parsed = fmt("hermes").parse(
        '<tool_call>{"name": "f", "arguments": "{\\"q\\": \\"été\\", \\"n\\": [1, 2]}"}</tool_call>'
    )
    assert parsed.calls[0].arguments == '{"q":"été","n":[1,2]}'
    missing = fmt("llama3").parse('{"name": "now"}')
    assert missing.calls[0].arguments == "{}"


def test_functiongemma_values_become_json() -> None:
    reply = (
        '<start_function_call>call:book{who:<escape>Ana, "B" {x}<escape>,n:2,ratio:0.5,ok:false,'
        "none:null,tags:[<escape>a<escape>,<escape>b<escape>],where:{city:<escape>Paris<escape>}}"
        "<end_function_call>"
    )
    (call,) = fmt("functiongemma").parse(reply).calls
    assert json.loads(call.arguments) == {
        "who": 'Ana, "B" {x}',
        "n": 2,
        "ratio": 0.5,
        "ok": False,
        "none": None,
        "tags": ["a", "b"],
        "where": {"city": "Paris"},
    }


def test_xml_values_are_typed_by_the_tools_schema_where_given() -> None:
    reply = (
        "<tool_call>\n<function=write>\n<parameter=path>\n42\n</parameter>\n<parameter=text>\nline 1\n"
        "line 2\n</parameter>\n<parameter=count>\n3\n</parameter>\n<parameter=force>\nTrue\n</parameter>\n"
        '<parameter=meta>\n{"a": [1]}\n</parameter>\n</function>\n</tool_call>'
    )
    untyped = json.loads(fmt("qwen3_coder").parse(reply).calls[0].arguments)
    assert untyped == {"path": 42, "text": "line 1\nline 2", "count": 3, "force": True, "meta": {"a": [1]}}
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "count": {"type": "integer"},
            "force": {"type": "boolean"},
        },
    }
    typed = fmt("qwen3_coder").parse(reply, [ToolSpec("write", "", schema)])
    assert json.loads(typed.calls[0].arguments)["path"] == "42"
    stream = fmt("qwen3_coder").stream([ToolSpec("write", "", schema)])
    (call,) = [item for item in stream.feed(reply) + stream.finish() if isinstance(item, ToolCall)]
    assert call.arguments == typed.calls[0].arguments


def test_a_reply_continued_after_the_call_marker_parses_when_the_marker_is_fed_first() -> None:
    form = fmt("hermes")
    assert form.call_marker == "<tool_call>"
    assert tool_format_for(None).call_marker is None
    stream = form.stream()
    items = stream.feed(form.call_marker) + stream.feed('\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert [item.name for item in items if isinstance(item, ToolCall)] == ["f"]


def test_formats_say_what_to_stop_on() -> None:
    assert fmt("functiongemma").stop == ("<start_function_response>",)
    assert fmt("hermes").stop == ()
