"""Images on `snapcache serve --mmproj`, in all four dialects, each driven by its own client as it
comes from the registry (`openai` for Chat Completions and Responses, `anthropic`, `ollama`): an
image is read once, then restored by its pixels in the next turn, in a repeated request (the answer
as cold's), and after a restart; other pixels are read afresh from their image on; what is not an
image's bytes is a 400 that names its field.

The model is the suite's tiny vision model (a llama with a LLaVA projector, 64 tokens an image), so
each request runs in a fraction of a second.
"""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from image_files import picture, png
from server_process import ServerProcess, http_json, running_server, start_server, wait_until_written
from tiny_model import VISION_IMAGE_TOKENS, write_tiny_vision_model

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.model

SYSTEM = "You are a desktop agent. Look at each screenshot, find the control the user names, click it. " * 2
ANSWER_TOKENS = 6


@dataclass(frozen=True)
class Turn:
    """One message of a chat: a user's text with a screenshot before it, or an assistant's text."""

    role: str
    text: str
    image: bytes | None = None


@dataclass(frozen=True)
class Reply:
    """What a dialect answered: the text, and the prompt tokens it read afresh."""

    text: str
    read: int


def screenshot(seed: int) -> bytes:
    return png(picture(seed, 64, 48))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{b64(data)}"


# -- one function per dialect: the chat as its client sends it ------------------------------------


def chat_completions(server: ServerProcess, turns: list[Turn], scope: str) -> Reply:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in turns:
        if turn.image is None:
            messages.append({"role": turn.role, "content": turn.text})
            continue
        parts = [
            {"type": "image_url", "image_url": {"url": data_url(turn.image)}},
            {"type": "text", "text": turn.text},
        ]
        messages.append({"role": turn.role, "content": parts})
    with openai.OpenAI(
        base_url=server.api_url, api_key="unused", max_retries=0, default_headers={"X-Snapcache-Scope": scope}
    ) as api:
        answer = api.chat.completions.create(
            model="m", messages=messages, max_tokens=ANSWER_TOKENS, temperature=0
        )
    usage = answer.usage
    cached = usage.prompt_tokens_details.cached_tokens
    return Reply(answer.choices[0].message.content or "", usage.prompt_tokens - cached)


def responses(server: ServerProcess, turns: list[Turn], scope: str) -> Reply:
    items: list[dict[str, Any]] = []
    for turn in turns:
        kind = "input_text" if turn.role == "user" else "output_text"
        content: list[dict[str, Any]] = [{"type": kind, "text": turn.text}]
        if turn.image is not None:
            content.insert(0, {"type": "input_image", "image_url": data_url(turn.image), "detail": "auto"})
        items.append({"type": "message", "role": turn.role, "content": content})
    with openai.OpenAI(
        base_url=server.api_url, api_key="unused", max_retries=0, default_headers={"X-Snapcache-Scope": scope}
    ) as api:
        answer = api.responses.create(
            model="m", instructions=SYSTEM, input=items, max_output_tokens=ANSWER_TOKENS, temperature=0
        )
    usage = answer.usage
    return Reply(answer.output_text, usage.input_tokens - usage.input_tokens_details.cached_tokens)


def anthropic_messages(server: ServerProcess, turns: list[Turn], scope: str) -> Reply:
    messages: list[dict[str, Any]] = []
    for turn in turns:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.text}]
        if turn.image is not None:
            source = {"type": "base64", "media_type": "image/png", "data": b64(turn.image)}
            blocks.insert(0, {"type": "image", "source": source})
        messages.append({"role": turn.role, "content": blocks})
    with anthropic.Anthropic(
        base_url=server.base_url,
        api_key="unused",
        max_retries=0,
        default_headers={"X-Snapcache-Scope": scope},
    ) as api:
        answer = api.messages.create(
            model="m",
            system=SYSTEM,
            messages=messages,
            max_tokens=ANSWER_TOKENS,
            extra_body={"temperature": 0},
        )
    text = "".join(block.text for block in answer.content if block.type == "text")
    return Reply(text, answer.usage.input_tokens)


def ollama_chat(server: ServerProcess, turns: list[Turn], scope: str) -> Reply:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in turns:
        message: dict[str, Any] = {"role": turn.role, "content": turn.text}
        if turn.image is not None:
            message["images"] = [turn.image]  # the client sends them as base64
        messages.append(message)
    client = ollama.Client(host=server.base_url, headers={"X-Snapcache-Scope": scope})
    try:
        answer = client.chat(
            model="m", messages=messages, options={"temperature": 0, "num_predict": ANSWER_TOKENS}
        )
    finally:
        client.close()
    return Reply(answer.message.content or "", answer.prompt_eval_count)


Ask = Callable[[ServerProcess, list[Turn], str], Reply]
DIALECTS: dict[str, Ask] = {
    "chat_completions": chat_completions,
    "responses": responses,
    "anthropic": anthropic_messages,
    "ollama": ollama_chat,
}


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_vision_model(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def server(
    vision_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    model, mmproj = vision_model
    directory = tmp_path_factory.mktemp("serve-images")
    with running_server(
        model, directory / "cache", directory / "log.txt", "--mmproj", str(mmproj)
    ) as running:
        yield running


# -- restores ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_screenshot_is_read_once_then_restored_in_the_repeat_and_the_next_turn(
    server: ServerProcess, dialect: str
) -> None:
    ask = DIALECTS[dialect]
    scope = f"next-turn-{dialect}"
    first = [Turn("user", "Click the OK button.", screenshot(10 + len(dialect)))]
    cold = ask(server, first, scope)
    assert cold.read > VISION_IMAGE_TOKENS  # the system text, the screenshot and the question

    again = ask(server, first, scope)
    assert again.text == cold.text  # restored, the answer is cold's
    assert again.read < VISION_IMAGE_TOKENS  # the screenshot was not read again

    later = [*first, Turn("assistant", cold.text or "Done."), Turn("user", "Now click Cancel.")]
    turn_two = ask(server, later, scope)
    assert turn_two.read < VISION_IMAGE_TOKENS, server.log()[-2000:]


def test_other_pixels_are_read_from_their_image_on(server: ServerProcess) -> None:
    question = "Which window is in front?"
    first = chat_completions(server, [Turn("user", question, screenshot(1))], "other-pixels")
    other = chat_completions(server, [Turn("user", question, screenshot(2))], "other-pixels")
    # The system text before the image is restored; the other screenshot and what follows are read.
    assert VISION_IMAGE_TOKENS <= other.read < first.read
    status, why, _ = http_json("GET", server.base_url + "/snapcache/why?scope=other-pixels")
    assert status == 200
    assert why["prompt_text"].startswith("[image]"), why


def test_a_screenshot_in_a_tool_result_restores_in_the_next_turn(server: ServerProcess) -> None:
    """Anthropic's computer use: the agent's screenshot comes back as a tool result's image."""
    shot = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(screenshot(3))},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Open the settings."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [shot]}]},
    ]
    tools = [{"name": "screenshot", "description": "Take a screenshot.", "input_schema": {"type": "object"}}]
    with anthropic.Anthropic(
        base_url=server.base_url,
        api_key="unused",
        max_retries=0,
        default_headers={"X-Snapcache-Scope": "tool-shot"},
    ) as api:

        def ask() -> Any:
            return api.messages.create(
                model="m", system=SYSTEM, messages=messages, tools=tools, max_tokens=ANSWER_TOKENS
            )

        first, second = ask(), ask()
        counted = api.messages.count_tokens(model="m", system=SYSTEM, messages=messages, tools=tools)
    assert first.usage.input_tokens > VISION_IMAGE_TOKENS
    assert second.usage.input_tokens < VISION_IMAGE_TOKENS
    assert second.usage.cache_read_input_tokens > VISION_IMAGE_TOKENS
    # count_tokens counts the screenshot's tokens as the model reads them.
    whole = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert counted.input_tokens == whole


def test_ollama_says_the_model_sees_and_the_schema_describes_images(server: ServerProcess) -> None:
    status, shown, _ = http_json("POST", server.base_url + "/api/show", json.dumps({"model": "m"}).encode())
    assert status == 200
    assert "vision" in shown["capabilities"]
    _, schema, _ = http_json("GET", server.base_url + "/openapi.json")
    schemas = json.dumps(schema["components"]["schemas"])
    assert '"const": "image_url"' in schemas
    assert '"const": "input_image"' in schemas
    assert "ImageBlock" in json.dumps(schema["components"]["schemas"]["UserMessage"])


def test_screenshots_restore_after_a_restart_in_every_dialect(
    vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    model, mmproj = vision_model
    chats = {
        name: [Turn("user", f"Find the {name} icon.", screenshot(20 + i))] for i, name in enumerate(DIALECTS)
    }
    server = start_server(model, tmp_path / "cache", tmp_path / "first.txt", "--mmproj", str(mmproj))
    try:
        before = {name: DIALECTS[name](server, chat, f"restart-{name}") for name, chat in chats.items()}
        wait_until_written(server)
    finally:
        server.kill(signal.SIGTERM)
    with running_server(model, tmp_path / "cache", tmp_path / "second.txt", "--mmproj", str(mmproj)) as again:
        after = {name: DIALECTS[name](again, chat, f"restart-{name}") for name, chat in chats.items()}
    for name in DIALECTS:
        assert before[name].read > VISION_IMAGE_TOKENS, name
        assert after[name].read < VISION_IMAGE_TOKENS, (name, after[name])
        assert after[name].text == before[name].text, name


# -- what is not an image's bytes ---------------------------------------------------------------------

PNG_URL = "https://example.com/screen.png"
NOT_AN_IMAGE = b64(b"%PDF-1.7 not a picture")
# Its header whole (a 64 x 48 PNG), its pixels damaged: only decoding finds it out.
DAMAGED = b64(screenshot(6)[:60] + b"\x00" * 40)

BAD_BODIES = [
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]}]},
        "messages.0.content.0.image_url",
        "fetches nothing",
        id="chat-completions-url",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{NOT_AN_IMAGE}"}}
                    ],
                }
            ]
        },
        "messages.0.content.0.image_url",
        "not a PNG, JPEG, GIF or BMP",
        id="chat-completions-not-an-image",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]}]},
        "messages.0.content",
        "text only",
        id="chat-completions-system-image",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Click OK."},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{DAMAGED}"}},
                    ],
                }
            ]
        },
        "messages.0.content.1.image_url",
        "could not be decoded",
        id="chat-completions-damaged",
    ),
    pytest.param(
        "/v1/messages",
        {
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": "Look."},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "shot", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        # The tool result goes before the text (a message of its own), its image with it.
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": b64(screenshot(7)),
                            },
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [
                                {
                                    "type": "image",
                                    "source": {"type": "base64", "media_type": "image/png", "data": DAMAGED},
                                }
                            ],
                        },
                    ],
                },
            ],
        },
        "messages.2.content.1.content.0.source.data",
        "could not be decoded",
        id="anthropic-damaged-in-a-tool-result",
    ),
    pytest.param(
        "/v1/messages/count_tokens",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": DAMAGED},
                        }
                    ],
                }
            ],
        },
        "messages.0.content.0.source.data",
        "could not be decoded",
        id="anthropic-count-damaged",
    ),
    pytest.param(
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": PNG_URL}]}]},
        "input.0.content.0.image_url",
        "fetches nothing",
        id="responses-url",
    ),
    pytest.param(
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
        "input.0.content.0",
        "file_id",
        id="responses-file-id",
    ),
    pytest.param(
        "/v1/messages",
        {
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": PNG_URL}}]}
            ],
        },
        "messages.0.content.0.source",
        "fetches nothing",
        id="anthropic-url",
    ),
    pytest.param(
        "/v1/messages",
        {
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "@@@"},
                        }
                    ],
                }
            ],
        },
        "messages.0.content.0.source.data",
        "base64 is damaged",
        id="anthropic-bad-base64",
    ),
    pytest.param(
        "/api/chat",
        {"stream": False, "messages": [{"role": "user", "content": "hi", "images": [NOT_AN_IMAGE]}]},
        "messages.0.images.0",
        "not a PNG, JPEG, GIF or BMP",
        id="ollama-not-an-image",
    ),
    pytest.param(
        "/api/generate",
        {"stream": False, "prompt": "hi", "images": [7]},
        "images.0",
        "base64 text",
        id="ollama-generate-not-text",
    ),
]


def error_text(document: Any) -> str:
    """The message of an error answer, in whichever dialect's shape."""
    error = document["error"]
    return str(error["message"] if isinstance(error, dict) else error)


@pytest.mark.parametrize(("path", "body", "field", "says"), BAD_BODIES)
def test_what_is_not_an_image_s_bytes_is_a_400_naming_its_field(
    server: ServerProcess, path: str, body: dict[str, Any], field: str, says: str
) -> None:
    status, document, _ = http_json(
        "POST", server.base_url + path, json.dumps({"model": "m", **body}).encode()
    )
    assert status == 400, document
    message = error_text(document)
    assert field in message, message
    assert says in message, message
    # The server goes on answering.
    assert (
        chat_completions(server, [Turn("user", "Still there?", screenshot(4))], "after-bad").text is not None
    )


def test_a_model_served_without_its_projector_says_how_to_read_images(
    vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    model, _ = vision_model
    with running_server(model, tmp_path / "cache", tmp_path / "log.txt") as server:
        image = data_url(screenshot(5))
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}],
        }
        status, document, _ = http_json(
            "POST", server.api_url + "/chat/completions", json.dumps(body).encode()
        )
        ollama_body = {
            "model": "m",
            "stream": False,
            "messages": [{"role": "user", "content": "hi", "images": [b64(screenshot(5))]}],
        }
        ollama_status, ollama_document, _ = http_json(
            "POST", server.base_url + "/api/chat", json.dumps(ollama_body).encode()
        )
        # An image with no prompt (what would only load the model) is refused too.
        load_body = {"model": "m", "stream": False, "prompt": "", "images": [b64(screenshot(5))]}
        generate_status, generate_document, _ = http_json(
            "POST", server.base_url + "/api/generate", json.dumps(load_body).encode()
        )
        _, schema, _ = http_json("GET", server.base_url + "/openapi.json")
    assert status == 400
    assert "messages.0.content.0.image_url" in error_text(document)
    assert "--mmproj" in error_text(document)
    assert ollama_status == 400
    assert generate_status == 400
    assert "images.0" in error_text(generate_document)
    assert "--mmproj" in error_text(ollama_document)
    # Its schema says so: no image part, block or list is valid there.
    assert "ImageBlock" not in json.dumps(schema["components"]["schemas"]["UserMessage"])
    assert schema["components"]["schemas"]["Message"]["properties"]["images"]["anyOf"][1]["maxItems"] == 0
