"""Restore-then-continue equals a cold read, for every tiny architecture and every setting that matters.

Each case writes a state with one Llama (first completion: cold, saved), restores it into a NEW Llama
through a new store for a prompt that shares a long prefix, and compares that completion with a cold
Llama's for the same prompt: the greedy tokens and the last logits, bit for bit. A combination that
cannot be exact is a miss by design: nothing restored, and one logged reason.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest
from conftest import LLAMA_THREADS
from tiny_model import ARCHITECTURES, control_vector, write_tiny_lora, write_tiny_model

from snapcache.llama.exactness.adapters import set_control_vector, set_lora_adapters
from snapcache.llama.exactness.choice import Exactness
from snapcache.llama.exactness.support import FLASH_ATTN_REASON, unsupported_reason
from snapcache.llama.hook.cached import CachedLlama
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

N_CTX = 512
MAX_TOKENS = 12
SCOPE = "matrix"
# About 190 byte tokens shared, then two different endings: the second prompt restores the
# checkpoint at 128 tokens the first one left, and reads the rest.
_SHARED = (
    "A long shared beginning that both prompts read: the system prompt of an assistant that knows "
    "the train timetable of a small town, its platforms, its delays and where to buy a ticket. "
)
FIRST_PROMPT = _SHARED + "When does the first train leave?"
SECOND_PROMPT = _SHARED + "Which platform is the night train on, please?"

Hook = Callable[[llama_cpp.Llama, "Models"], None]


@dataclass(frozen=True)
class Setting:
    """Llama arguments for the writer and for the reader (and cold reference), and a hook run after
    each Llama is built."""

    writer: dict[str, Any] = field(default_factory=dict)
    reader: dict[str, Any] | None = None  # None: as the writer
    after_build: Hook | None = None
    archs: tuple[str, ...] = ARCHITECTURES


class Models:
    """Tiny models and adapters, each written once per session on first use."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._paths: dict[str, Path] = {}

    def model(self, arch: str) -> Path:
        return self._written(arch, lambda path: write_tiny_model(path, arch))

    def lora(self, arch: str) -> Path:
        return self._written(f"{arch}-lora", lambda path: write_tiny_lora(path, arch, seed=7))

    def _written(self, name: str, write: Callable[[Path], Path]) -> Path:
        if name not in self._paths:
            self._paths[name] = write(self._root / f"{name}.gguf")
        return self._paths[name]


def _lora_after_build(llm: llama_cpp.Llama, models: Models) -> None:
    arch = _arch(llm)
    set_lora_adapters(llm, [(models.lora(arch), 0.8)])


def _control_vector_after_build(llm: llama_cpp.Llama, models: Models) -> None:
    n_embd = int(llama_cpp.llama_model_n_embd(llm.model))
    set_control_vector(llm, control_vector(n_embd, seed=3))


def _kv_overrides(arch: str) -> dict[str, Any]:
    return {"kv_overrides": {f"{arch}.attention.layer_norm_rms_epsilon": 1e-3}}


_KV_TYPES = {"q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
_ATTENTION = tuple(arch for arch in ARCHITECTURES if arch != "mamba")

SETTINGS: dict[str, Setting] = {
    "default": Setting(),
    "flash-attn": Setting({"flash_attn": True}),
    # A quantized V cache needs flash attention (llama.cpp turns it on) and 32-wide heads.
    **{
        f"kv-{name}": Setting(
            {"type_k": ggml_type, "type_v": ggml_type, "flash_attn": True},
            archs=tuple(arch for arch in _ATTENTION if arch != "llama"),
        )
        for name, ggml_type in _KV_TYPES.items()
    },
    "k-q8_0": Setting({"type_k": llama_cpp.GGML_TYPE_Q8_0}, archs=("llama",)),
    # Batch sizes no multiple of 64, the reader's n_batch another than the writer's. (A point restores
    # where it lies 16 tokens or more from both ends of a batch of the reader's, `ReadGrid`: where the
    # two split their reads elsewhere, few of the writer's points are the reader's.)
    "odd-batches": Setting({"n_batch": 100, "n_ubatch": 50}, {"n_batch": 150, "n_ubatch": 50}),
    "other-threads": Setting({"n_threads": 1, "n_threads_batch": 1}, {}),
    "swa-full-off": Setting({"swa_full": False}, archs=("gemma2",)),
    "kv-overrides": Setting(),  # filled in per architecture below
    "lora-after-build": Setting(after_build=_lora_after_build, archs=("llama", "qwen2", "qwen3")),
    "control-vector": Setting(after_build=_control_vector_after_build),
}

# Combinations that cannot be exact: every lookup is a miss, with this reason logged once.
MISSES_BY_DESIGN: dict[tuple[str, str], str] = {
    (arch, "flash-attn"): FLASH_ATTN_REASON for arch in _ATTENTION
}

CASES = [
    pytest.param(arch, name, id=f"{arch}-{name}")
    for name, setting in SETTINGS.items()
    for arch in setting.archs
]


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("matrix-models"))


def _arch(llm: llama_cpp.Llama) -> str:
    buffer = ctypes.create_string_buffer(64)
    llama_cpp.llama_model_meta_val_str(llm.model, b"general.architecture", buffer, len(buffer))
    return buffer.value.decode()


def _settings(arch: str, name: str, role: str) -> dict[str, Any]:
    setting = SETTINGS[name]
    if name == "kv-overrides":
        return _kv_overrides(arch)
    kwargs = setting.writer if role == "writer" or setting.reader is None else setting.reader
    return dict(kwargs)


def _build(models: Models, arch: str, name: str, role: str) -> llama_cpp.Llama:
    kwargs: dict[str, Any] = {"n_threads": LLAMA_THREADS, "n_threads_batch": LLAMA_THREADS}
    kwargs.update(_settings(arch, name, role))
    llm = llama_cpp.Llama(str(models.model(arch)), n_ctx=N_CTX, verbose=False, **kwargs)
    hook = SETTINGS[name].after_build
    if hook is not None:
        hook(llm, models)
    return llm


def _greedy(complete: Callable[..., Any], llm: llama_cpp.Llama) -> tuple[list[int], npt.NDArray[np.float32]]:
    """Complete SECOND_PROMPT greedily: the context's tokens and the last logits llama.cpp computed."""
    complete(SECOND_PROMPT, max_tokens=MAX_TOKENS, temperature=0.0)
    tokens = [int(t) for t in llm.input_ids[: llm.n_tokens]]
    n_vocab = int(llm.n_vocab())
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()
    return tokens, logits


@pytest.mark.parametrize(("arch", "name"), CASES)
def test_restore_then_continue_equals_cold(
    arch: str, name: str, models: Models, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir = tmp_path / "cache"
    # The default ("auto") where restores can be exact: on this CPU build it must choose exact. Where
    # they cannot, exact=True insists, and every lookup is a miss ("auto" restores inexactly there).
    exact: Exactness = True if (arch, name) in MISSES_BY_DESIGN else "auto"
    writer = _build(models, arch, name, "writer")
    try:
        with SnapshotStore(cache_dir, ram_bytes=32 << 20, disk_bytes=64 << 20) as store:
            CachedLlama(writer, store, SCOPE, exact=exact).create_completion(
                FIRST_PROMPT, max_tokens=4, temperature=0.0
            )
    finally:
        writer.close()

    reader = _build(models, arch, name, "reader")
    cold = _build(models, arch, name, "reader")
    reason = MISSES_BY_DESIGN.get((arch, name))
    try:
        assert unsupported_reason(reader) == reason
        caplog.clear()  # the writer said it once too
        with caplog.at_level(logging.DEBUG, logger="snapcache"), SnapshotStore(cache_dir) as store:
            cached = CachedLlama(reader, store, SCOPE, exact=exact)
            restored_tokens, restored_logits = _greedy(cached.create_completion, reader)
        info = cached.last_restore
        cold_tokens, cold_logits = _greedy(cold.create_completion, cold)
    finally:
        reader.close()
        cold.close()

    assert info is not None
    assert cached.exactness.exact
    if reason is None:
        assert cached.exactness.asked == "auto"
        assert info.restored_tokens > 0, f"{arch}/{name}: nothing restored"
        assert info.source in ("ram", "disk")
    else:
        assert info.restored_tokens == 0
        assert sum(reason in record.getMessage() for record in caplog.records) == 1
    assert restored_tokens == cold_tokens
    assert np.array_equal(restored_logits, cold_logits), (
        f"{arch}/{name}: logits differ by up to {np.abs(restored_logits - cold_logits).max()}"
    )


@pytest.mark.parametrize(
    ("flash_attn", "type_kv", "split_changes_logits"),
    [
        pytest.param(True, llama_cpp.GGML_TYPE_F16, True, id="flash-attn-f16"),
        pytest.param(True, llama_cpp.GGML_TYPE_Q8_0, False, id="flash-attn-q8_0"),
        pytest.param(False, llama_cpp.GGML_TYPE_F16, False, id="no-flash-attn-f16"),
    ],
)
def test_why_flash_attention_over_f16_is_a_miss(
    models: Models, flash_attn: bool, type_kv: int, split_changes_logits: bool
) -> None:
    """The fact behind the miss: one context, the same tokens read whole or as 256 + 56 tokens (a
    batch under 64 tokens) gives other logits with flash attention over F16, the same otherwise."""
    tokens = [3 + (i * 37) % 250 for i in range(312)]

    def last_logits(splits: list[int]) -> npt.NDArray[np.float32]:
        llm = llama_cpp.Llama(
            str(models.model("qwen3")),
            n_ctx=N_CTX,
            n_threads=LLAMA_THREADS,
            n_threads_batch=LLAMA_THREADS,
            flash_attn=flash_attn,
            type_k=type_kv,
            type_v=type_kv,
            verbose=False,
        )
        try:
            start = 0
            for end in [*splits, len(tokens)]:
                llm.eval(tokens[start:end])
                start = end
            n_vocab = int(llm.n_vocab())
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()
        finally:
            llm.close()

    whole = last_logits([])
    assert np.array_equal(last_logits([192]), whole)  # 120 tokens: the same kernel
    assert (not np.array_equal(last_logits([256]), whole)) == split_changes_logits
