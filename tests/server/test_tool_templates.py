"""Conversations with tools rendered through real chat templates, and the calls they show parsed back.

The templates are in tests/data/chat_templates (SOURCES.md there says where each comes from and under
which license): Qwen 2.5 and Qwen 3 (Hermes format), Qwen3-Coder (XML calls), Mistral Nemo and Mistral
Small 3.2, and two written for these tests that reproduce the Llama 3.x and FunctionGemma formats.
"""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp
import pytest

from snapcache.server.tools import ToolSpec, render_prompt, tool_format_for

if TYPE_CHECKING:
    from llama_cpp import Llama

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "chat_templates"

TOOLS = [
    ToolSpec(
        "get_weather",
        "Current weather in a city.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ),
    ToolSpec(
        "get_time",
        "Local time in a city.",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ),
]
QUESTION = [
    {"role": "developer", "content": "You answer about cities."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Weather and time "}, {"type": "text", "text": "in Paris?"}],
    },
]
CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_w",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {
            "id": "call_t",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"city":"Paris"}'},
        },
    ],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call_w", "content": "sunny, 21 C"},
    {"role": "tool", "tool_call_id": "call_t", "content": "14:05"},
]
ANSWER = [
    {"role": "assistant", "content": "Sunny, 21 C, and 14:05."},
    {"role": "user", "content": "And in Rome?"},
]

# template file, format, BOS and EOS texts, what ends an assistant turn in the rendered prompt
CASES = {
    "qwen2.5": ("qwen2.5-7b-instruct.jinja", "hermes", "", "<|im_end|>", "<|im_end|>\n"),
    "qwen3": ("qwen3-0.6b.jinja", "hermes", "", "<|im_end|>", "<|im_end|>\n"),
    "qwen3-coder": ("qwen3-coder.jinja", "qwen3_coder", "", "<|im_end|>", "<|im_end|>\n"),
    "llama3": ("llama3-tools.jinja", "llama3", "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"),
    "mistral-nemo": ("mistral-nemo-instruct-2407.jinja", "mistral", "<s>", "</s>", "</s>"),
    "mistral-small-3.2": ("mistral-small-3.2-24b-instruct-2506.jinja", "mistral", "<s>", "</s>", "</s>"),
    "functiongemma": ("functiongemma.jinja", "functiongemma", "<bos>", "<eos>", ""),
}


def render(
    case: str, messages: list[dict[str, object]], *, generation: bool = True, tools: bool = True
) -> str:
    file, _, bos, eos, _ = CASES[case]
    return render_prompt(
        (TEMPLATES / file).read_text(), bos, eos, messages, TOOLS if tools else None, generation
    )


@pytest.mark.parametrize("case", CASES)
def test_the_template_says_its_format(case: str) -> None:
    form = tool_format_for((TEMPLATES / CASES[case][0]).read_text())
    assert form.name == CASES[case][1]
    assert form.native
    assert form.renders_tools


@pytest.mark.parametrize("case", CASES)
def test_calls_rendered_by_the_template_parse_back(case: str) -> None:
    """A model writes its calls as its template shows them: the format reads them back exactly."""
    calls = CALLS
    if case == "llama3":  # one call per message in Llama 3.x
        calls = {**CALLS, "tool_calls": CALLS["tool_calls"][:1]}  # type: ignore[index]
    question = QUESTION[1:]  # Mistral Nemo moves the system text to the last user turn
    before = render(case, question)
    after = render(case, [*question, calls], generation=False)
    assert after.startswith(before)
    reply = after[len(before) :].removesuffix(CASES[case][4])
    parsed = tool_format_for((TEMPLATES / CASES[case][0]).read_text()).parse(reply)
    expected = [(c["function"]["name"], {"city": "Paris"}) for c in calls["tool_calls"]]  # type: ignore[index]
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == expected
    # Qwen 3's template shows an empty reasoning block before the calls of the last turn.
    assert parsed.content == ("<think>\n\n</think>" if case == "qwen3" else "")


def positions(prompt: str, *texts: str) -> list[int]:
    found = [prompt.find(text) for text in texts]
    assert all(at >= 0 for at in found), [t for t, at in zip(texts, found, strict=True) if at < 0]
    return found


@pytest.mark.parametrize("case", ["qwen2.5", "qwen3"])
def test_hermes_templates_put_tools_in_the_system_turn_and_results_in_a_user_turn(case: str) -> None:
    prompt = render(case, [*QUESTION, CALLS, *RESULTS, *ANSWER])
    system = prompt[: prompt.index("<|im_end|>")]
    assert system.startswith("<|im_start|>system\nYou answer about cities.")
    assert '"name": "get_weather", "description": "Current weather in a city."' in system
    assert "<|im_start|>user\nWeather and time in Paris?<|im_end|>" in prompt
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>\n"
        "<tool_response>\n14:05\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny, 21 C, and 14:05.<|im_end|>\n"
        "<|im_start|>user\nAnd in Rome?<|im_end|>\n<|im_start|>assistant\n"
    ) in prompt


def test_llama_gets_tools_in_the_first_user_turn_and_one_call_per_turn() -> None:
    prompt = render("llama3", [*QUESTION, CALLS, *RESULTS, *ANSWER])
    header = "<|start_header_id|>{}<|end_header_id|>\n\n"
    system, user, tools = positions(
        prompt,
        header.format("system") + "Environment: ipython",
        header.format("user"),
        '"name": "get_weather"',
    )
    assert system < user < tools < prompt.index("Weather and time in Paris?")
    call_w, result_w, call_t, result_t = positions(
        prompt,
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        header.format("ipython") + "sunny, 21 C<|eot_id|>",
        '{"name": "get_time", "parameters": {"city": "Paris"}}<|eot_id|>',
        header.format("ipython") + "14:05<|eot_id|>",
    )
    assert call_w < result_w < call_t < result_t


@pytest.mark.parametrize("case", ["mistral-nemo", "mistral-small-3.2"])
def test_mistral_templates_get_nine_character_ids_the_same_every_turn(case: str) -> None:
    conversation = [*QUESTION, CALLS, *RESULTS, *ANSWER]
    prompt = render(case, conversation)
    assert prompt == render(case, conversation)
    tools_at, question_at = positions(prompt, "[AVAILABLE_TOOLS]", "And in Rome?[/INST]")
    assert tools_at < question_at  # the tools sit before the last user message, as Mistral's do
    if case == "mistral-nemo":
        ids = [call["id"] for call in json.loads(prompt.split("[TOOL_CALLS]")[1].split("</s>")[0])]
        results = prompt.split("[TOOL_RESULTS]")[1:]
        assert [
            json.loads(r.split("[/TOOL_RESULTS]")[0].replace("sunny, 21 C", '"x"').replace("14:05", '"y"'))[
                "call_id"
            ]
            for r in results
        ] == ids
    else:
        ids = [part.split("[ARGS]")[0] for part in prompt.split("[CALL_ID]")[1:]]
        assert f"[TOOL_RESULTS]{ids[0]}[TOOL_CONTENT]sunny, 21 C[/TOOL_RESULTS]" in prompt
        assert f"[TOOL_RESULTS]{ids[1]}[TOOL_CONTENT]14:05[/TOOL_RESULTS]" in prompt
    assert len(set(ids)) == 2
    assert all(len(i) == 9 and i.isalnum() for i in ids)


def test_functiongemma_declares_tools_in_the_developer_turn() -> None:
    prompt = render("functiongemma", [*QUESTION, CALLS, *RESULTS, *ANSWER])
    assert prompt.startswith(
        "<bos><start_of_turn>developer\nYou answer about cities.<start_function_declaration>"
        "declaration:get_weather{description:<escape>Current weather in a city.<escape>,"
        "parameters:{properties:{city:{type:<escape>STRING<escape>}},"
        "required:[<escape>city<escape>],type:<escape>OBJECT<escape>}}"
        "<end_function_declaration>"
    )
    assert (
        "<start_of_turn>model\n"
        "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>"
        "<start_function_call>call:get_time{city:<escape>Paris<escape>}<end_function_call>"
        "<start_function_response>response:get_weather{value:<escape>sunny, 21 C<escape>}"
        "<end_function_response>"
        "<start_function_response>response:get_time{value:<escape>14:05<escape>}<end_function_response>"
        "Sunny, 21 C, and 14:05.<end_of_turn>\n"
    ) in prompt


@pytest.mark.parametrize("case", CASES)
def test_without_tools_no_tool_text_is_rendered(case: str) -> None:
    prompt = render(
        case, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], tools=False
    )
    assert "Hi" in prompt
    for marker in ("<tools>", "[AVAILABLE_TOOLS]", "Environment: ipython", "<start_function_declaration>"):
        assert marker not in prompt


def test_template_variables_reach_the_template() -> None:
    template = (TEMPLATES / "qwen3-0.6b.jinja").read_text()
    chat = [{"role": "user", "content": "Hi"}]
    plain = render_prompt(template, "", "", chat)
    quiet = render_prompt(template, "", "", chat, variables={"enable_thinking": False})
    assert quiet == plain + "<think>\n\n</think>\n\n"


def grammar_allows(llm: Llama, grammar: str, text: str) -> bool:
    """Whether llama.cpp's sampler, under `grammar`, lets the tiny model write `text` and then end.

    The tiny model's vocabulary is its 256 byte tokens (ids 3 + byte) besides `<unk>`, `<s>` and `</s>`:
    `text` is its bytes, one token each."""
    sampler = llama_cpp.llama_sampler_init_grammar(llm._model.vocab, grammar.encode(), b"root")
    assert sampler, grammar
    try:
        for token in [3 + byte for byte in text.encode()] + [llm.token_eos()]:
            candidates = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 1.0, 0.0))
            array = llama_cpp.llama_token_data_array(candidates, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if candidates[0].logit == -math.inf:
                return False
            if token != llm.token_eos():
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


@pytest.mark.model
@pytest.mark.parametrize("case", CASES)
def test_the_grammar_of_a_required_call_allows_the_calls_the_template_renders(case: str, tiny_llama) -> None:
    """What a model writes for tool_choice "required" is held to its template's own calls: the two
    calls the template renders are allowed (one on Llama 3.x), a call of a tool not chosen is not."""
    form = tool_format_for((TEMPLATES / CASES[case][0]).read_text())
    single = case == "llama3"
    calls = {**CALLS, "tool_calls": CALLS["tool_calls"][:1]} if single else CALLS  # type: ignore[index]
    question = QUESTION[1:]
    before = render(case, question)
    reply = render(case, [*question, calls], generation=False)[len(before) :].removesuffix(CASES[case][4])
    marker = form.call_marker or ""
    reply = reply[reply.index(marker) :] if marker in reply else reply  # Qwen 3's empty reasoning block
    assert grammar_allows(tiny_llama, form.grammar(TOOLS, parallel=True), reply), reply
    if not single:
        assert not grammar_allows(tiny_llama, form.grammar(TOOLS, parallel=False), reply)
    only_time = form.grammar(TOOLS[1:], parallel=True)
    assert not grammar_allows(tiny_llama, only_time, reply)
    assert not grammar_allows(tiny_llama, form.grammar(TOOLS, parallel=True), "Plain text. " + reply)


def test_a_grammar_starts_with_the_marker_token_where_the_vocabulary_has_one() -> None:
    form = tool_format_for((TEMPLATES / "mistral-small-3.2-24b-instruct-2506.jinja").read_text())
    ids = {"[TOOL_CALLS]": 5, "[ARGS]": 6}
    grammar = form.grammar(TOOLS[:1], parallel=False, token_of=ids.get)
    root = next(line for line in grammar.splitlines() if line.startswith("tool-call ::="))
    # [CALL_ID] is no token here: spelled out.
    assert root == 'tool-call ::= <[5]> ("get_weather" "[CALL_ID]" [a-zA-Z0-9]{9} <[6]> arguments-0)'
