"""Restores with the K/V cache in a device's memory, on the paths a GPU user runs: one context through
`CachedLlama` and `attach`, from RAM and from disk after a restart, under each setting that changes
where and how llama.cpp keeps the cache (layers on the GPU, flash attention, the K/V type, a sliding
window). Restored greedy tokens are compared with a cold run's wherever `auto` chose exact; where it
chose inexact, the choice and its reason are what the test shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from snapcache.llama.hook.cached import CachedLlama
from snapcache.llama.state.host_memory import offloads_kv
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

N_CTX = 1024
PROMPT = "You are a careful desktop assistant. Answer in one short line.\n" * 6 + "Question: why?\nAnswer:"
GREEDY: dict[str, Any] = {"max_tokens": 16, "temperature": 0.0}


@dataclass(frozen=True)
class Setting:
    """One way to load a model onto the device: which model, how many layers on the GPU, and the cache."""

    model: str  # "tiny", "wide" (32-wide heads, for a quantized cache) or "gemma2" (sliding window)
    gpu_layers: int = -1
    flash_attention: str = "off"
    kv_cache: str = "f16"

    @property
    def id(self) -> str:
        return f"{self.model}-gpu{self.gpu_layers}-fa_{self.flash_attention}-{self.kv_cache}"

    def kwargs(self) -> dict[str, Any]:
        return {"kv_cache": self.kv_cache, "flash_attention": self.flash_attention}


SETTINGS = [
    Setting("tiny"),
    Setting("tiny", gpu_layers=0),
    Setting("tiny", gpu_layers=1),
    Setting("wide", flash_attention="on"),
    Setting("wide", flash_attention="on", kv_cache="q8_0"),
    Setting("gemma2"),
]


@pytest.fixture
def model_paths(
    tiny_model_path: Path, wide_heads_model_path: Path, gemma2_model_path: Path
) -> dict[str, Path]:
    return {"tiny": tiny_model_path, "wide": wide_heads_model_path, "gemma2": gemma2_model_path}


def completion_tokens(llm: Any, prompt: str) -> list[int]:
    """The greedy answer's tokens (its text would hide a difference in how bytes split)."""
    text = llm.create_completion(prompt, **GREEDY)["choices"][0]["text"]
    llama = llm.llm if isinstance(llm, CachedLlama) else llm
    return list(llama.tokenize(text.encode(), add_bos=False, special=True))


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.id)
def test_a_restore_on_the_device_answers_as_cold_from_ram_and_from_disk(
    setting: Setting, on_gpu: Any, model_paths: dict[str, Path], tmp_path: Path, gpu: Any
) -> None:
    path = model_paths[setting.model]
    cold_llm = on_gpu(path, setting.gpu_layers, n_ctx=N_CTX, **setting.kwargs())
    assert offloads_kv(cold_llm) == (setting.gpu_layers != 0)
    cold = completion_tokens(cold_llm, PROMPT)
    cold_llm.close()

    directory = tmp_path / "cache"
    with SnapshotStore(directory, ram_bytes=64 << 20, disk_bytes=256 << 20) as store:
        first = CachedLlama(on_gpu(path, setting.gpu_layers, n_ctx=N_CTX, **setting.kwargs()), store)
        choice = first.exactness
        print(f"\n{setting.id} on {gpu.describe()}: {choice.describe()}")
        assert choice.reason
        saved = completion_tokens(first, PROMPT)
        from_ram = CachedLlama(on_gpu(path, setting.gpu_layers, n_ctx=N_CTX, **setting.kwargs()), store)
        restored_ram = completion_tokens(from_ram, PROMPT)
        ram_restore = from_ram.last_restore
        store.flush()
    # A restart: a new store on the same directory has nothing in RAM; the states come from disk.
    with SnapshotStore(directory, ram_bytes=64 << 20, disk_bytes=256 << 20) as store:
        from_disk = CachedLlama(on_gpu(path, setting.gpu_layers, n_ctx=N_CTX, **setting.kwargs()), store)
        restored_disk = completion_tokens(from_disk, PROMPT)
        disk_restore = from_disk.last_restore

    assert ram_restore is not None
    assert disk_restore is not None
    assert ram_restore.restored_tokens >= 64
    assert disk_restore.restored_tokens >= 64
    assert ram_restore.source == "ram"
    assert disk_restore.source == "disk"
    if choice.exact:
        assert saved == cold
        assert restored_ram == cold
        assert restored_disk == cold
    else:  # inexact: restored at any token; the answer is the model's, not compared
        assert restored_ram
        assert restored_disk


def test_auto_probes_the_device_and_says_what_it_chose_and_why(
    gpu: Any, snapcache_command: Any, tiny_model_path: Path, tmp_path: Path
) -> None:
    """`auto` measures once per fingerprint whether a split prompt reads on bit for bit on this build
    and device, and notes it in the cache directory: `snapcache warm` in a fresh process on the GPU
    (every layer, the commands' default on a GPU build), then what `snapcache doctor` shows of it."""
    prompt = tmp_path / "system.txt"
    prompt.write_text(PROMPT, encoding="utf-8")
    cache = ("--cache-dir", str(tmp_path / "cache"))
    status, report = snapcache_command(*cache, "warm", str(prompt), "--model", str(tiny_model_path), "--json")
    assert status == 0
    print(f"\nauto on {gpu.describe()}: {report['exactness']}")
    assert report["exactness"]["asked"] == "auto"
    assert report["exactness"]["reason"]
    checks = {check["name"]: check for check in snapcache_command(*cache, "doctor", "--json")[1]["checks"]}
    exact = report["exactness"]["mode"] == "exact"
    counts = f"{int(exact)} restore exactly and {int(not exact)} inexactly"
    probed = f"of the 1 model settings probed here, {counts}"
    assert probed in checks["exactness"]["detail"]
    assert "a GPU build" in checks["exactness"]["detail"]
