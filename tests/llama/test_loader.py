"""`load_llama`: bad files fail in one line before llama.cpp parses them; Gemma 3 gets its chat template."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from snapcache import InvalidArgument, ModelError, SnapcacheError, load_llama
from snapcache.llama.setup.loader import usable_cores
from snapcache.llama.templates.chat_templates import GEMMA3_TEMPLATE

SYSTEM = "You are Desk, a careful assistant. Never delete files."
QUESTION = "Where is the plumber's invoice?"


def load_error(path: Path, capfd: pytest.CaptureFixture[str]) -> ModelError:
    """The ModelError `load_llama(path)` raises; llama.cpp must not have written a word to stderr."""
    with pytest.raises(ModelError) as caught:
        load_llama(path, n_ctx=256)
    error = caught.value
    message = str(error)
    assert str(path) in message
    assert len(message.splitlines()) == 1
    # Nothing of llama.cpp's own exception is chained on: a caller printing the error sees one line.
    assert error.__cause__ is None
    assert error.__suppress_context__ or error.__context__ is None
    assert capfd.readouterr().err == ""
    return error


def rendered_prompt(llm, messages) -> str:
    """The prompt a real chat completion gave llama.cpp, with special tokens spelled out."""
    result = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0.0)
    tokens = llm.input_ids[: result["usage"]["prompt_tokens"]].tolist()
    return llm.detokenize(tokens, special=True).decode("utf-8")


# -- files llama.cpp never sees ---------------------------------------------------------------------


def test_a_missing_file(tmp_path, capfd):
    error = load_error(tmp_path / "nowhere.gguf", capfd)
    assert str(error).startswith("model file not found:")
    assert isinstance(error, SnapcacheError)
    assert isinstance(error, RuntimeError)


def test_a_directory(tmp_path, capfd):
    assert str(load_error(tmp_path, capfd)).startswith("model path is not a file:")


def test_a_file_that_is_not_gguf(tmp_path, capfd):
    path = tmp_path / "notes.gguf"
    path.write_text("a text file with a model's name\n", encoding="utf-8")
    assert str(load_error(path, capfd)).startswith("not a GGUF model file:")


def test_an_empty_file(tmp_path, capfd):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert str(load_error(path, capfd)).startswith("model file is empty:")


def test_a_file_shorter_than_the_magic(tmp_path, capfd):
    path = tmp_path / "short.gguf"
    path.write_bytes(b"GG")
    assert str(load_error(path, capfd)).startswith("not a GGUF model file:")


def test_bad_arguments_are_invalid_arguments(tiny_model_path):
    for kwargs in ({"n_ctx": -1}, {"n_ctx": "512"}, {"n_ctx": True}, {"n_threads": 0}, {"n_threads": 1.5}):
        with pytest.raises(InvalidArgument):
            load_llama(tiny_model_path, **kwargs)


# -- files llama.cpp rejects ------------------------------------------------------------------------


@pytest.mark.model
def test_a_truncated_gguf(tiny_model_path, tmp_path, capfd):
    path = tmp_path / "truncated.gguf"
    path.write_bytes(tiny_model_path.read_bytes()[:4096])
    error = load_error(path, capfd)
    assert str(error) == (
        f"llama.cpp could not load {path}: truncated, corrupt or an unsupported architecture"
    )


@pytest.mark.model
def test_a_gguf_with_only_its_header(tiny_model_path, tmp_path, capfd):
    path = tmp_path / "header.gguf"
    path.write_bytes(tiny_model_path.read_bytes()[:24])
    assert str(load_error(path, capfd)).startswith("llama.cpp could not load")


# -- a model that loads -----------------------------------------------------------------------------


@pytest.mark.model
def test_threads_default_to_the_usable_cores(tiny_model_path):
    """Reads this machine's usable cores on purpose: whatever their number, they are the default."""
    llm = load_llama(tiny_model_path, n_ctx=256)
    try:
        assert (llm.n_threads, llm.n_threads_batch) == (usable_cores(), usable_cores())
        assert llm.n_ctx() == 256
        assert llm.verbose is False
    finally:
        llm.close()
    llm = load_llama(str(tiny_model_path), n_ctx=256, n_threads=1)
    try:
        assert (llm.n_threads, llm.n_threads_batch) == (1, 1)
    finally:
        llm.close()
    llm = load_llama(tiny_model_path, n_ctx=256, n_threads=1, n_threads_batch=2)
    try:
        assert (llm.n_threads, llm.n_threads_batch) == (1, 2)
    finally:
        llm.close()


@pytest.mark.model
def test_a_model_with_a_chat_template_keeps_its_own(tiny_model_path):
    llm = load_llama(tiny_model_path, n_ctx=256, n_threads=2)
    try:
        assert "tokenizer.chat_template" in llm.metadata
        assert llm.chat_handler is None
        assert llm.chat_format == "chat_template.default"
    finally:
        llm.close()


# -- the demo model ---------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.gemma
def test_the_demo_model_gets_gemma3s_template(gemma_model_path):
    llm = load_llama(gemma_model_path, n_ctx=512, n_threads=2)
    try:
        assert llm.metadata["general.architecture"] == "gemma3"
        assert "tokenizer.chat_template" not in llm.metadata
        assert llm.chat_handler is not None
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        prompt = rendered_prompt(llm, messages)
    finally:
        llm.close()
    # Gemma 3 has no system turn: the system text opens the first user turn.
    assert prompt == f"<bos><start_of_turn>user\n{SYSTEM}\n\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
    assert prompt.endswith("<start_of_turn>model\n")


@pytest.mark.model
@pytest.mark.gemma
def test_a_chat_format_given_for_the_demo_model_is_kept(gemma_model_path):
    llm = load_llama(gemma_model_path, n_ctx=512, n_threads=2, chat_format="chatml")
    try:
        assert llm.chat_handler is None
        assert llm.chat_format == "chatml"
        prompt = rendered_prompt(
            llm, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
        )
    finally:
        llm.close()
    assert "<|im_start|>system\n" + SYSTEM in prompt


def test_the_template_is_gemma3s():
    from jinja2 import Environment

    template = Environment().from_string(GEMMA3_TEMPLATE)
    turns = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": " Q1 "},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    assert template.render(messages=turns, bos_token="<bos>", add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nS\n\nQ1<end_of_turn>\n"
        "<start_of_turn>model\nA1<end_of_turn>\n"
        "<start_of_turn>user\nQ2<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    without_system = template.render(messages=turns[1:2], bos_token="<bos>", add_generation_prompt=False)
    assert without_system == "<bos><start_of_turn>user\nQ1<end_of_turn>\n"


# -- llama.cpp's log --------------------------------------------------------------------------------

ROUTED_LOG = textwrap.dedent(
    """
    import json, logging, sys
    from snapcache import load_llama
    from snapcache.llama import route_llama_cpp_log

    seen = {"snapcache.llama_cpp": [], "app.llama": []}

    class Keep(logging.Handler):
        def emit(self, record):
            seen[record.name].append((record.levelname, record.getMessage()))

    for name in seen:
        logger = logging.getLogger(name)
        logger.addHandler(Keep())
        logger.setLevel(logging.DEBUG)
        logger.propagate = False

    route_llama_cpp_log()
    load_llama(sys.argv[1], n_ctx=256, n_threads=1).close()
    route_llama_cpp_log(logging.getLogger("app.llama"), level=logging.DEBUG)
    load_llama(sys.argv[1], n_ctx=256, n_threads=1).close()
    print(json.dumps(seen))
    """
)


@pytest.mark.model
def test_llama_cpp_log_goes_to_logging_only_when_asked(tiny_model_path):
    done = subprocess.run(
        [sys.executable, "-c", ROUTED_LOG, str(tiny_model_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stderr == ""
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    first, second = seen["snapcache.llama_cpp"], seen["app.llama"]
    # Each line at llama.cpp's own level; after the second call, all of them at the level asked for.
    assert {level for level, _ in first} <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    assert any(level == "INFO" and str(tiny_model_path) in text for level, text in first)
    assert any(str(tiny_model_path) in text for _, text in second)
    assert {level for level, _ in second} == {"DEBUG"}


# -- the K/V cache ------------------------------------------------------------------------------------


def test_kv_cache_sets_the_cache_type_and_flash_attention_together(wide_heads_model_path):
    import llama_cpp

    from snapcache.llama.exactness.support import unsupported_reason

    disabled = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    for name, cache_type, flash_attn in [
        ("q8_0", llama_cpp.GGML_TYPE_Q8_0, True),
        ("q4_0", llama_cpp.GGML_TYPE_Q4_0, True),
        ("f16", llama_cpp.GGML_TYPE_F16, False),
    ]:
        llm = load_llama(wide_heads_model_path, n_ctx=256, kv_cache=name)
        params = llm.context_params
        assert (params.type_k, params.type_v) == (cache_type, cache_type)
        assert (params.flash_attn_type != disabled) is flash_attn
        assert unsupported_reason(llm) is None  # every choice keeps restores exact
        llm.close()


def test_kv_cache_refuses_an_unknown_name_and_the_keywords_it_sets(wide_heads_model_path):
    with pytest.raises(InvalidArgument, match="one of f16, q8_0, q4_0, got 'f32'"):
        load_llama(wide_heads_model_path, n_ctx=256, kv_cache="f32")
    with pytest.raises(InvalidArgument, match="kv_cache sets flash_attn"):
        load_llama(wide_heads_model_path, n_ctx=256, kv_cache="q8_0", flash_attn=False)


# -- the sliding-window cache --------------------------------------------------------------------------


def test_swa_cache_sizes_the_window_cache_and_the_fingerprint_tells_them_apart(tmp_path):
    from tiny_model import write_tiny_model

    from snapcache.llama.exactness.fingerprint import model_fingerprint
    from snapcache.llama.state.sequences import pads_windows

    model = write_tiny_model(tmp_path / "tiny-gemma2.gguf", "gemma2")
    fingerprints = {}
    for name, full in [("full", True), ("window", False), (None, False)]:
        llm = load_llama(model, n_ctx=256, swa_cache=name)
        assert bool(llm.context_params.swa_full) is full
        assert pads_windows(llm) is full
        fingerprints[name] = model_fingerprint(llm)
        llm.close()
    assert fingerprints["window"] == fingerprints[None] != fingerprints["full"]


def test_swa_cache_left_out_sizes_the_window_as_llama_server_does_unless_swa_full_is_given(tmp_path):
    from tiny_model import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny-gemma2.gguf", "gemma2")
    for kwargs, full in [({}, False), ({"swa_full": True}, True), ({"swa_full": False}, False)]:
        llm = load_llama(model, n_ctx=256, **kwargs)
        assert bool(llm.context_params.swa_full) is full, kwargs
        llm.close()


def test_swa_cache_refuses_an_unknown_name_and_the_keyword_it_sets(wide_heads_model_path):
    with pytest.raises(InvalidArgument, match="one of full, window, got 'half'"):
        load_llama(wide_heads_model_path, n_ctx=256, swa_cache="half")
    with pytest.raises(InvalidArgument, match="swa_cache sets swa_full"):
        load_llama(wide_heads_model_path, n_ctx=256, swa_cache="window", swa_full=True)


# -- flash attention -----------------------------------------------------------------------------------


def test_flash_attention_auto_is_off_over_f16_on_the_cpu_and_on_over_a_quantized_cache(wide_heads_model_path):
    import llama_cpp

    disabled = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    for kv_cache, mode, flash_attn in [
        (None, "auto", False),  # an f16 cache on the CPU: restores stay exact
        ("f16", "auto", False),
        ("q8_0", "auto", True),  # llama.cpp needs it for a quantized V cache
        (None, "on", True),
        ("f16", "on", True),
        (None, "off", False),
    ]:
        llm = load_llama(wide_heads_model_path, n_ctx=256, kv_cache=kv_cache, flash_attention=mode)
        assert (llm.context_params.flash_attn_type != disabled) is flash_attn, (kv_cache, mode)
        llm.close()


def test_flash_attention_refuses_an_unknown_mode_off_over_a_quantized_cache_and_the_keyword_it_sets(
    wide_heads_model_path,
):
    with pytest.raises(InvalidArgument, match="one of auto, on, off, got 'yes'"):
        load_llama(wide_heads_model_path, n_ctx=256, flash_attention="yes")
    with pytest.raises(InvalidArgument, match="a quantized V cache needs flash attention"):
        load_llama(wide_heads_model_path, n_ctx=256, kv_cache="q8_0", flash_attention="off")
    with pytest.raises(InvalidArgument, match="flash_attention sets flash_attn"):
        load_llama(wide_heads_model_path, n_ctx=256, flash_attention="on", flash_attn=True)
