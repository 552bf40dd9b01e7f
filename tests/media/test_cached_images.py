"""Chats with images through `CachedLlama(..., mmproj=)` and `attach(..., mmproj=)`, on the tiny
vision model the suite writes: the same pixels restore, in another chat, another Llama and another
process, and every restored answer is the cold answer token for token."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from image_files import bmp, picture, png
from tiny_model import VISION_IMAGE_TOKENS, write_tiny_vision_model

from snapcache import SnapshotStore
from snapcache.errors import InvalidArgument
from snapcache.llama import CachedLlama, attach, detach, load_llama
from snapcache.llama.media import ImageError

pytestmark = pytest.mark.model

# Greedy, a few tokens, no byte above 0x7F (a random model could stop inside a UTF-8 character).
OPTIONS: dict[str, Any] = {
    "temperature": 0.0,
    "max_tokens": 8,
    "logit_bias": {3 + byte: -100.0 for byte in range(0x80, 0x100)},
}
SYSTEM = "You are a desktop agent. Look at each screenshot, find the control the user names, click it. " * 2


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_vision_model(tmp_path_factory.mktemp("vision"))


@pytest.fixture
def new_llm(vision_model: tuple[Path, Path]) -> Iterator[Any]:
    made: list[llama_cpp.Llama] = []

    def make() -> llama_cpp.Llama:
        made.append(load_llama(vision_model[0], n_ctx=2048, n_batch=64, n_ubatch=64, n_threads=2))
        return made[-1]

    yield make
    for llm in made:
        llm.close()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def screenshot_turn(text: str, image: bytes, kind: str = "png") -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": data_url(image, kind)}},
            {"type": "text", "text": " Which control is it?"},
        ],
    }


def chat(*turns: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, *turns]


def answer(cached: CachedLlama, messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The reply's text and the prompt tokens restored for it."""
    result = cached.create_chat_completion(messages, **OPTIONS)
    restored = cached.last_restore
    assert restored is not None
    return str(result["choices"][0]["message"]["content"]), restored.restored_tokens


def cold(new_llm: Any, vision_model: tuple[Path, Path], messages: list[dict[str, Any]]) -> str:
    """The reply of a Llama that restores nothing (a store of its own, empty)."""
    with SnapshotStore(None) as store:
        reply, restored = answer(CachedLlama(new_llm(), store, mmproj=vision_model[1]), messages)
    assert restored == 0
    return reply


def test_the_same_screenshot_restores_in_another_llama_and_answers_as_cold(
    new_llm: Any, vision_model: tuple[Path, Path], tmp_path: Path
) -> None:
    messages = chat(screenshot_turn("Open the settings.", png(picture(20))))
    expected = cold(new_llm, vision_model, messages)
    with SnapshotStore(tmp_path / "store") as store:
        first = CachedLlama(new_llm(), store, mmproj=vision_model[1])
        assert answer(first, messages) == (expected, 0)
        again = answer(first, messages)  # the Llama's own context, or the store
        other = answer(CachedLlama(new_llm(), store, mmproj=vision_model[1]), messages)
        prompt_tokens = first.last_restore.prompt_tokens if first.last_restore else 0
    assert again[0] == other[0] == expected
    for _, restored in (again, other):
        # everything but the last piece of the prompt's cold read, images included
        assert restored > prompt_tokens - 64 > VISION_IMAGE_TOKENS


def test_other_pixels_restore_only_what_comes_before_them(
    new_llm: Any, vision_model: tuple[Path, Path]
) -> None:
    seen = chat(screenshot_turn("Open the settings.", png(picture(21))))
    changed = chat(screenshot_turn("Open the settings.", png(picture(22))))
    expected = cold(new_llm, vision_model, changed)
    with SnapshotStore(None) as store:
        answer(CachedLlama(new_llm(), store, mmproj=vision_model[1]), seen)
        cached = CachedLlama(new_llm(), store, mmproj=vision_model[1])
        reply, restored = answer(cached, changed)
        prompt_tokens = cached.last_restore.prompt_tokens if cached.last_restore else 0
        # The miss is explained where the other image starts (its key tokens never reach llama.cpp's
        # detokenizer, which would abort the process).
        why = cached.explain()
    assert reply == expected
    # At most the text before the image: the image and the text after it (some 30 tokens) are read.
    assert 0 < restored <= prompt_tokens - VISION_IMAGE_TOKENS - 8
    assert why is not None
    assert why.diverged_at is not None
    assert restored <= why.diverged_at  # the image starts there: a restore stops at or before it
    assert why.prompt_text.startswith("[image]")
    assert why.stored_text.startswith("[image]")


def test_the_same_pixels_in_another_format_and_an_earlier_turn_restore(
    new_llm: Any, vision_model: tuple[Path, Path]
) -> None:
    """Turn 2 of a computer-use loop: the first screenshot (sent again as BMP) and its answer, then a
    second screenshot. The prompt restores past the first image; the answer is cold's."""
    first_turn = screenshot_turn("Open the settings.", png(picture(23)))
    turn_two = chat(
        screenshot_turn("Open the settings.", bmp(picture(23)), kind="bmp"),
        {"role": "assistant", "content": "Clicked the gear icon."},
        screenshot_turn("Now turn on dark mode.", png(picture(24))),
    )
    expected = cold(new_llm, vision_model, turn_two)
    with SnapshotStore(None) as store:
        answer(CachedLlama(new_llm(), store, mmproj=vision_model[1]), chat(first_turn))
        cached = CachedLlama(new_llm(), store, mmproj=vision_model[1])
        reply, restored = answer(cached, turn_two)
    assert reply == expected
    assert restored > VISION_IMAGE_TOKENS + len(SYSTEM) // 2  # the system prompt, the first screenshot


RESTART = """
import json, sys
sys.path[:0] = sys.argv[4:]
from test_cached_images import OPTIONS
from snapcache import SnapshotStore
from snapcache.llama import CachedLlama, load_llama
messages = json.loads(sys.argv[3])
llm = load_llama(sys.argv[1], n_ctx=2048, n_batch=64, n_ubatch=64, n_threads=2)
with SnapshotStore(sys.argv[2] + "/store") as store:
    cached = CachedLlama(llm, store, mmproj=sys.argv[2] + "/mmproj.gguf")
    result = cached.create_chat_completion(messages, **OPTIONS)
    print(json.dumps([result["choices"][0]["message"]["content"], cached.last_restore.restored_tokens,
                      result["usage"]["prompt_tokens_details"]["cached_tokens"]]))
llm.close()
"""


def test_a_screenshot_restores_after_a_restart(vision_model: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "mmproj.gguf").write_bytes(vision_model[1].read_bytes())
    messages = json.dumps(chat(screenshot_turn("Open the settings.", png(picture(25)))))
    helpers = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]

    def run() -> list[Any]:
        done = subprocess.run(
            [sys.executable, "-c", RESTART, str(vision_model[0]), str(tmp_path), messages, *helpers],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return list(json.loads(done.stdout.strip().splitlines()[-1]))

    first, second = run(), run()
    assert first[1] == 0
    assert second[0] == first[0]
    assert second[1] > VISION_IMAGE_TOKENS
    assert second[2] >= second[1]  # reported to OpenAI clients as cached tokens


def test_attach_caches_chats_with_images(new_llm: Any, vision_model: tuple[Path, Path]) -> None:
    messages = chat(screenshot_turn("Close the window.", png(picture(26))))
    expected = cold(new_llm, vision_model, messages)
    with SnapshotStore(None) as store:
        llm = new_llm()
        hook = attach(llm, store, mmproj=vision_model[1])
        try:
            llm.create_chat_completion(messages=messages, **OPTIONS)
            llm.reset()  # nothing live: the second restores from the store
            result = llm.create_chat_completion(messages=messages, **OPTIONS)
            restored = hook.last_restore
        finally:
            detach(llm)
    assert result["choices"][0]["message"]["content"] == expected
    assert restored is not None
    assert restored.source == "ram"
    assert restored.restored_tokens > VISION_IMAGE_TOKENS


def test_a_streamed_answer_is_the_answer(new_llm: Any, vision_model: tuple[Path, Path]) -> None:
    messages = chat(screenshot_turn("Scroll down.", png(picture(27))))
    expected = cold(new_llm, vision_model, messages)
    with SnapshotStore(None) as store:
        cached = CachedLlama(new_llm(), store, mmproj=vision_model[1])
        answer(cached, messages)
        chunks = cached.create_chat_completion(messages, stream=True, **OPTIONS)
        text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    assert text == expected
    assert cached.last_restore is not None
    assert cached.last_restore.restored_tokens > VISION_IMAGE_TOKENS


@pytest.mark.parametrize(
    ("url", "error", "says"),
    [
        ("https://example.com/screen.png", InvalidArgument, "fetches nothing"),
        ("data:image/png;base64,!!!not base64!!!", ImageError, "base64 is damaged"),
        ("data:image/png;base64," + base64.b64encode(b"no image at all").decode(), ImageError, "not a PNG"),
        ("screen.png", InvalidArgument, "base64 data URL"),
    ],
)
def test_an_image_that_is_not_one_is_a_clear_error_and_the_llama_goes_on(
    new_llm: Any, vision_model: tuple[Path, Path], url: str, error: type[Exception], says: str
) -> None:
    bad = chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]})
    good = chat(screenshot_turn("Open the settings.", png(picture(28))))
    expected = cold(new_llm, vision_model, good)
    with SnapshotStore(None) as store:
        cached = CachedLlama(new_llm(), store, mmproj=vision_model[1])
        with pytest.raises(error, match=says):
            cached.create_chat_completion(bad, **OPTIONS)
        assert answer(cached, good)[0] == expected


def test_a_warmed_system_prompt_restores_for_a_chat_with_a_screenshot(
    new_llm: Any, vision_model: tuple[Path, Path]
) -> None:
    messages = chat(screenshot_turn("Open the settings.", png(picture(29))))
    expected = cold(new_llm, vision_model, messages)
    with SnapshotStore(None) as store:
        warmed = CachedLlama(new_llm(), store, mmproj=vision_model[1]).warm(SYSTEM)
        cached = CachedLlama(new_llm(), store, mmproj=vision_model[1])
        reply, restored = answer(cached, messages)
        explained = cached.explain()  # what it restored, in words: no image token is decoded
    assert reply == expected
    assert restored >= warmed.key.token_count - 16  # the system prompt (or the point a piece before it)
    assert explained is not None
    assert explained.restored_tokens == restored


def test_a_chat_handler_that_tokenizes_on_its_own_is_refused_not_fed_markers(
    new_llm: Any, vision_model: tuple[Path, Path]
) -> None:
    llm = new_llm()

    def own_tokenizer(*, llama: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        text = "".join(str(message["content"]) for message in messages)
        tokens = list(type(llama).tokenize(llama, text.encode(), True, True))  # past llama.tokenize
        return llama.create_completion(prompt=tokens, **kwargs)

    llm.chat_handler = own_tokenizer
    with SnapshotStore(None) as store:
        cached = CachedLlama(llm, store, mmproj=vision_model[1])
        with pytest.raises(InvalidArgument, match="does not let snapcache read the chat's images"):
            cached.create_chat_completion(chat(screenshot_turn("Open it.", png(picture(30)))), **OPTIONS)
