"""The generic tool format (tools in the system text, calls as JSON) on its own: what the template
gets, what a reply parses to, and what a reply shows as it streams: its text, and each call's
arguments as they are written."""

from __future__ import annotations

import json

import pytest
from llama_cpp.llama_grammar import LlamaGrammar

from snapcache.server.chat.chat_request import ChatMessage, ChatRequest, NamedTool
from snapcache.server.chat.dialects.chat_completions.chat_completions import chat_request
from snapcache.server.chat.dialects.chat_completions.chat_completions_protocol import ChatCompletionRequest
from snapcache.server.chat.engine.generic_tools import GenericTools
from snapcache.server.tools import ToolCall, ToolCallDelta, ToolCallDropped, ToolSpec

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = ToolSpec(
    "get_time", "The time in a city.", {"type": "object", "properties": {"city": {"type": "string"}}}
)
TOOLS = GenericTools(vocab=None)


def request(*messages: ChatMessage, choice: str = "auto", parallel: bool = True) -> ChatRequest:
    """A chat offering both tools; `choice` a mode, or else a tool's name."""
    named = choice if choice in ("auto", "none", "required") else NamedTool(choice)
    return ChatRequest(messages, tools=(WEATHER, TIME), tool_choice=named, parallel_tool_calls=parallel)  # type: ignore[arg-type]


def streamed(reply: str, chat: ChatRequest, size: int) -> list[object]:
    """What the reader gives for `reply` fed `size` characters at a time."""
    reader = TOOLS.reader(chat)
    items: list[object] = []
    for at in range(0, len(reply), size):
        items.extend(reader.feed(reply[at : at + size]))
    return [*items, *reader.finish()]


@pytest.mark.parametrize("parallel", [True, False])
def test_tools_go_into_the_system_text_and_history_into_plain_turns(parallel: bool) -> None:
    calls = (
        ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_2", "get_time", '{"city": "Paris"}'),
    )
    chat = request(
        ChatMessage("system", "You help."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", calls),
        ChatMessage("tool", "Sunny", tool_call_id="call_1"),
        ChatMessage("tool", "14:05", tool_call_id="call_2"),
        ChatMessage("user", "And tomorrow?"),
        parallel=parallel,
    )
    rendered = TOOLS.messages(chat)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith("You help.\n\n# Tools")
    assert '"name": "get_weather"' in rendered[0]["content"]
    # The system text asks for the form the grammar holds the answer to.
    assert ('{"tool_calls": [' in rendered[0]["content"]) == parallel
    made = [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_time", "arguments": {"city": "Paris"}},
    ]
    if parallel:
        assert json.loads(rendered[2]["content"]) == {"tool_calls": made}
    else:
        lines = rendered[2]["content"].split("\n")
        assert [json.loads(line) for line in lines] == [{"tool_call": call} for call in made]
    # The results and the next question are one user turn: templates want turns in turn.
    assert rendered[3]["content"] == (
        "Result of get_weather (call call_1):\nSunny\n\nResult of get_time (call call_2):\n14:05"
        "\n\nAnd tomorrow?"
    )


def test_tool_choice_none_leaves_the_tools_out() -> None:
    chat = request(ChatMessage("system", "You help."), ChatMessage("user", "Hi"), choice="none")
    assert TOOLS.messages(chat)[0]["content"] == "You help."
    assert TOOLS.grammar(chat) is None


@pytest.mark.parametrize(
    ("reply", "content", "names"),
    [
        ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}', "", ["get_weather"]),
        ('  {"response": "It is sunny."}', "It is sunny.", []),
        ("Plain words, no JSON.", "Plain words, no JSON.", []),
        (
            '{"tool_call": {"name": "unknown", "arguments": {}}}',
            '{"tool_call": {"name": "unknown", "arguments": {}}}',
            [],
        ),
        (
            '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "A"}}, '
            '{"name": "get_weather", "arguments": {"city": "B"}}]}',
            "",
            ["get_weather", "get_weather"],
        ),
    ],
    ids=["call", "text", "no json", "unknown tool", "two calls"],
)
def test_a_reply_parses_to_text_and_calls(reply: str, content: str, names: list[str]) -> None:
    text, calls = TOOLS.parse(reply, request(ChatMessage("user", "Hi")))
    assert text == content
    assert [call.name for call in calls] == names
    assert all(call.id.startswith("call_") and json.loads(call.arguments) for call in calls)


def test_parallel_tool_calls_off_keeps_the_first_call() -> None:
    call = {"name": "get_weather", "arguments": {"city": "A"}}
    reply = json.dumps({"tool_calls": [call, call]})
    _, calls = TOOLS.parse(reply, request(ChatMessage("user", "Hi"), parallel=False))
    assert len(calls) == 1


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_the_text_of_an_answer_streams_as_it_grows(size: int) -> None:
    chat = request(ChatMessage("user", "Hi"))
    reply = '{"response": "Say \\"hi\\" \\u00e9 \\ud83d\\ude00\\nbye"}'
    items = streamed(reply, chat, size)
    assert all(isinstance(item, str) for item in items)
    assert "".join(items) == TOOLS.parse(reply, chat)[0] == 'Say "hi" é 😀\nbye'  # type: ignore[arg-type]
    if size == 1:
        assert len(items) > 10  # shown piece by piece, not at the end


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_calls_stream_their_arguments_and_come_whole_with_the_same_ids(size: int) -> None:
    chat = request(ChatMessage("user", "Weather and time in Oslo?"))
    reply = (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "days": [1, {"x": "}"}]}}, '
        '{"name": "get_time", "arguments": {"city": "Oslo"}}]}'
    )
    items = streamed(reply, chat, size)
    deltas = [item for item in items if isinstance(item, ToolCallDelta)]
    calls = [item for item in items if isinstance(item, ToolCall)]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("get_weather", {"city": "Oslo", "days": [1, {"x": "}"}]}),
        ("get_time", {"city": "Oslo"}),
    ]
    assert not [item for item in items if isinstance(item, str)]
    for index, call in enumerate(calls):
        own = [delta for delta in deltas if delta.index == index]
        assert own[0].arguments == ""
        assert own[0].name == call.name
        assert {delta.id for delta in own} == {call.id}
        assert json.loads("".join(delta.arguments for delta in own)) == json.loads(call.arguments)
    # Every delta comes before the call it announces.
    assert items.index(calls[0]) > max(items.index(delta) for delta in deltas)


def test_a_call_cut_short_comes_back_as_text() -> None:
    """A call announced and then cut is dropped under the id it was announced with, its text given
    back in its place (a whole reply shows it as content; a stream ends the call there)."""
    chat = request(ChatMessage("user", "Hi"))
    reply = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Os'
    items = streamed(reply, chat, 4)
    opened = next(item for item in items if isinstance(item, ToolCallDelta))
    assert opened.arguments == ""
    assert not [item for item in items if isinstance(item, ToolCall | str)]
    assert items[-1] == ToolCallDropped(0, opened.id, reply)


def test_an_answer_cut_inside_its_calls_keeps_the_calls_it_finished() -> None:
    chat = request(ChatMessage("user", "Hi"))
    reply = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "get_time", "argu'
    items = streamed(reply, chat, 5)
    assert [(item.name, item.arguments) for item in items if isinstance(item, ToolCall)] == [
        ("get_weather", '{"city":"A"}')
    ]
    assert [item for item in items if isinstance(item, str)] == ['{"name": "get_time", "argu']


def test_a_call_made_again_finishes_the_answer_there() -> None:
    """Small models loop on a call (Gemma-3-270M wrote the same call until max_tokens): a call equal
    to one the answer made already ends the answer, and is not made twice."""
    chat = request(ChatMessage("user", "Hi"))
    first = '{"name": "get_weather", "arguments": {"city": "A"}}'
    reply = f'{{"tool_calls": [{first}, {{"name": "get_time", "arguments": {{}}}}, {first}, {{"name": "get_w'
    reader = TOOLS.reader(chat)
    items: list[object] = []
    fed = 0
    while not reader.finished:
        items.extend(reader.feed(reply[fed]))
        fed += 1
    assert reply[:fed].endswith(f"{first},")  # finished as the repetition closed
    items.extend(reader.finish())
    calls = [item for item in items if isinstance(item, ToolCall)]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("get_weather", {"city": "A"}),
        ("get_time", {}),
    ]
    assert not [item for item in items if isinstance(item, str)]
    # Written as the first call was, the repeat was held back piece by piece: never announced.
    assert {item.index for item in items if isinstance(item, ToolCallDelta)} == {0, 1}
    assert not [item for item in items if isinstance(item, ToolCallDropped)]


def test_a_call_that_starts_as_an_earlier_one_streams_once_it_differs() -> None:
    chat = request(ChatMessage("user", "Hi"))
    first = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    reply = f'{{"tool_calls": [{first}, {{"name": "get_weather", "arguments": {{"city": "Osaka"}}}}]}}'
    reader = TOOLS.reader(chat)
    items: list[object] = []
    announced_at = 0
    for at, char in enumerate(reply):
        given = reader.feed(char)
        if not announced_at and any(isinstance(item, ToolCallDelta) and item.index == 1 for item in given):
            announced_at = at + 1
        items.extend(given)
    items.extend(reader.finish())
    # Held while it read `{"city": "Os`, as the first call was written; passed on once it differed.
    assert reply[:announced_at].endswith('{"city": "Osa')
    second = [item for item in items if isinstance(item, ToolCallDelta) and item.index == 1]
    assert second[0].arguments == ""
    assert "".join(item.arguments for item in second) == '{"city": "Osaka"}'
    calls = [item for item in items if isinstance(item, ToolCall)]
    assert [call.arguments for call in calls] == ['{"city":"Oslo"}', '{"city":"Osaka"}']
    assert calls[1].id == second[0].id


def test_without_parallel_calls_only_the_first_call_streams() -> None:
    chat = request(ChatMessage("user", "Hi"), parallel=False)
    reply = json.dumps({"tool_call": {"name": "get_time", "arguments": {"city": "Rome"}}})
    items = streamed(reply, chat, 3)
    assert {item.index for item in items if isinstance(item, ToolCallDelta)} == {0}
    assert [item.name for item in items if isinstance(item, ToolCall)] == ["get_time"]


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
def test_every_choice_with_tools_has_a_grammar(choice: str, parallel: bool) -> None:
    grammar = TOOLS.grammar(request(ChatMessage("user", "Hi"), choice=choice, parallel=parallel))
    assert grammar is not None
    assert "root" in grammar._grammar
    assert ("response" in grammar._grammar) == (choice == "auto")
    assert ('"\\"tool_calls\\""' in grammar._grammar) == parallel
    assert ("get_time" in grammar._grammar) == (choice != "get_weather")


@pytest.mark.model
@pytest.mark.parametrize("name", ["get\b\x9a", 'say "\\hi\\"\f', "\U0001f600\x00"])
def test_a_tool_name_with_characters_json_escapes_still_has_a_grammar(
    name: str, make_llama, tiny_model_path
) -> None:
    """JSON writes a backspace as `\\b`, which llama.cpp's grammar parser refuses (a client's odd tool
    name then lost its grammar): the grammar's literals use only the escapes llama.cpp reads."""
    vocab = make_llama(tiny_model_path, n_ctx=256)._model.vocab
    odd = ToolSpec(name, "A tool with an odd name.", {"type": "object"})
    chat = ChatRequest((ChatMessage("user", "Hi"),), tools=(odd,), tool_choice="required")
    assert GenericTools(vocab=vocab).grammar(chat) is not None, "llama.cpp refused the grammar"


@pytest.mark.parametrize("name", ["none", "auto", "required"])
def test_a_tool_named_like_a_mode_and_chosen_by_name_is_the_one_called(name: str) -> None:
    """A function may be called "none": chosen by name, it is that call, not the mode."""
    tool = {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    body = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [tool, time_tool],
            "tool_choice": {"type": "function", "function": {"name": name}},
        }
    )
    chat = chat_request(body, "default")
    assert chat.tool_choice == NamedTool(name)
    assert chat.uses_tools
    grammar = TOOLS.grammar(chat)._grammar
    assert f'\\"{name}\\"' in grammar, grammar  # the name, as a JSON string literal
    assert "get_time" not in grammar
    assert "response" not in grammar  # a call, not text


def test_a_call_names_its_tool_before_its_arguments() -> None:
    grammar = TOOLS.grammar(request(ChatMessage("user", "Hi"), choice="required"))._grammar
    calls = [line for line in grammar.splitlines() if "name-kv" in line and "arguments-kv" in line]
    assert len(calls) == 2, grammar
    assert all(call.index("name-kv") < call.index("arguments-kv") for call in calls), grammar


@pytest.mark.model
def test_a_model_answer_with_two_calls_streams_and_parses_into_both(make_llama, tiny_model_path) -> None:
    """The tiny model's own answer, held by a grammar to two calls (its weights are random), read by
    the generic format's reader chunk by chunk as llama-cpp-python streams it."""
    chat = request(ChatMessage("system", "You help."), ChatMessage("user", "Weather and time in Oslo?"))
    city = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"]}
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": city},
            "required": ["name", "arguments"],
        }
        for name in ("get_weather", "get_time")
    ]
    answer = {
        "type": "object",
        "properties": {"tool_calls": {"type": "array", "items": calls}},  # these two, in this order
        "required": ["tool_calls"],
    }
    chunks = make_llama(tiny_model_path, n_ctx=2048).create_chat_completion(
        TOOLS.messages(chat),
        grammar=LlamaGrammar.from_json_schema(json.dumps(answer), verbose=False),
        max_tokens=400,
        temperature=0,
        stream=True,
    )
    reader = TOOLS.reader(chat)
    items: list[object] = []
    text = ""
    for chunk in chunks:
        piece = chunk["choices"][0]["delta"].get("content") or ""
        text += piece
        items.extend(reader.feed(piece))
    items.extend(reader.finish())
    calls = [item for item in items if isinstance(item, ToolCall)]
    assert len(calls) == 2, text
    assert [call.name for call in calls] == ["get_weather", "get_time"]
    assert all(json.loads(call.arguments)["city"] in ("Oslo", "Rome") for call in calls)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (c["name"], c["arguments"]) for c in json.loads(text)["tool_calls"]
    ]
    deltas = [item for item in items if isinstance(item, ToolCallDelta)]
    for index, made in enumerate(calls):
        pieces = [delta.arguments for delta in deltas if delta.index == index and delta.id == made.id]
        assert json.loads("".join(pieces)) == json.loads(made.arguments)
    assert not [item for item in items if isinstance(item, str)]
