"""The model with an 8B model's KV geometry loads, reads, and holds 128 KiB of state per token."""

from __future__ import annotations

import sys
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from conftest import MakeLlama
from test_sparse_memory import _kernel_maps_ahead, _resident_bytes
from tiny_model import write_geometry_model

from snapcache.llama.state.assembly import Assembly, _Layout
from snapcache.llama.state.blocks import KIND_PROMPT_END, read_record, split_state
from snapcache.llama.state.sequences import capture_sequence

pytestmark = [pytest.mark.model, pytest.mark.slow]

KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x heads x values x f16
# Each cell also records its position, its number of sequences and its sequence id.
CELL_BYTES = 12


@pytest.fixture(scope="module")
def geometry_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_geometry_model(tmp_path_factory.mktemp("models") / "geometry.gguf", seed=0)


def test_loads_with_the_8b_kv_geometry(geometry_model_path: Path, make_llama: MakeLlama) -> None:
    llm = make_llama(geometry_model_path, n_ctx=256)
    model = llm.model
    assert llama_cpp.llama_model_n_layer(model) == 32
    assert llama_cpp.llama_model_n_embd(model) == 256
    assert llm.metadata["llama.attention.head_count_kv"] == "8"
    assert llm.metadata["llama.attention.key_length"] == "128"
    assert llm.metadata["llama.attention.value_length"] == "128"


def test_state_is_128_kib_a_token(geometry_model_path: Path, make_llama: MakeLlama) -> None:
    llm = make_llama(geometry_model_path, n_ctx=256)
    tokens = [1] + [3 + (i * 37) % 256 for i in range(95)]
    llm.eval(tokens[:32])
    short = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
    llm.eval(tokens[32:])
    long = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
    assert (long - short) / 64 == KV_BYTES_PER_TOKEN + CELL_BYTES
    header = short - 32 * (KV_BYTES_PER_TOKEN + CELL_BYTES)
    assert 0 < header < 64 << 10


def test_greedy_output_depends_on_the_prompt(geometry_model_path: Path, make_llama: MakeLlama) -> None:
    llm = make_llama(geometry_model_path, n_ctx=256)
    outputs = set()
    for seed in range(3):
        prompt = [1] + [3 + (i * (seed + 5)) % 256 for i in range(40)]
        llm.reset()
        out = llm.create_completion(prompt, max_tokens=6, temperature=0.0)
        outputs.add(out["choices"][0]["text"])
    assert len(outputs) > 1


@pytest.mark.skipif(
    sys.platform != "linux" or not _kernel_maps_ahead(), reason="maps ahead on Linux 5.14 and later"
)
def test_the_blob_layout_maps_none_of_it_and_leaves_its_fields_to_the_threads(
    geometry_model_path: Path, make_llama: MakeLlama
) -> None:
    llm = make_llama(geometry_model_path, n_ctx=256)
    llm.eval([1] + [3 + (i * 37) % 256 for i in range(149)])
    captured = bytes(capture_sequence(llm).state)
    split = split_state(captured)
    assert split is not None
    record = read_record(split.record(150, KIND_PROMPT_END))
    first = np.frombuffer(split.block(0), dtype=np.uint8)
    layout = _Layout.of(first, 2, record, padded=False)
    # 64 layers' fields, each in its own huge page of an 18 MiB blob: none written yet, none mapped.
    assert layout.blob.nbytes > 16 << 20
    assert _resident_bytes(layout.blob.ctypes.data) == 0
    assert len(layout.first_writes) > 64

    assembly = Assembly(2, record)
    assembly.place(1, split.block(1))
    assembly.place(0, split.block(0))
    assert bytes(assembly.finish()) == captured
