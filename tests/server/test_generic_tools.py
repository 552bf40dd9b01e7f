"""The generic tool format (tools in the system text, calls as JSON) on its own: what the template
gets, what a reply parses to, and the text a partial reply already shows."""

from __future__ import annotations

import json

import pytest

from snapcache.server.chat.generic_tools import GenericTools
from snapcache.server.chat.request import ChatMessage, ChatRequest, ToolCallRequest, ToolSpec

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TOOLS = GenericTools(vocab=None)


def request(*messages: ChatMessage, choice: str = "auto", parallel: bool = True) -> ChatRequest:
    return ChatRequest(messages, tools=(WEATHER,), tool_choice=choice, parallel_tool_calls=parallel)


def test_tools_go_into_the_system_text_and_history_into_plain_turns() -> None:
    call = ToolCallRequest("call_1", "get_weather", '{"city": "Paris"}')
    chat = request(
        ChatMessage("system", "You help."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", "Sunny", tool_call_id="call_1"),
        ChatMessage("user", "And tomorrow?"),
    )
    rendered = TOOLS.messages(chat)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith("You help.\n\n# Tools")
    assert '"name": "get_weather"' in rendered[0]["content"]
    assert json.loads(rendered[2]["content"]) == {
        "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}
    }
    # The result and the next question are one user turn: templates want turns in turn.
    assert rendered[3]["content"] == "Result of get_weather (call call_1):\nSunny\n\nAnd tomorrow?"


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


def test_the_visible_text_of_a_partial_reply_only_grows() -> None:
    chat = request(ChatMessage("user", "Hi"))
    reply = '{"response": "Say \\"hi\\" \\u00e9 \\ud83d\\ude00\\nbye"}'
    shown = ""
    for end in range(len(reply) + 1):
        visible = TOOLS.visible_text(reply[:end], chat)
        assert visible.startswith(shown), (reply[:end], shown, visible)
        shown = visible
    assert shown == TOOLS.parse(reply, chat)[0] == 'Say "hi" é 😀\nbye'
    assert TOOLS.visible_text('{"tool_call": {"name": "get_weather"', chat) == ""


@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
def test_every_choice_with_tools_has_a_grammar(choice: str) -> None:
    grammar = TOOLS.grammar(request(ChatMessage("user", "Hi"), choice=choice))
    assert grammar is not None
    assert "root" in grammar._grammar
    assert ("response" in grammar._grammar) == (choice == "auto")


def test_a_call_names_its_tool_before_its_arguments() -> None:
    grammar = TOOLS.grammar(request(ChatMessage("user", "Hi"), choice="required"))._grammar
    call = next(line for line in grammar.splitlines() if line.startswith("tool-call ::="))
    assert call.index("name-kv") < call.index("arguments-kv"), grammar
