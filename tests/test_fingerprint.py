"""Model fingerprints: from the file's content and the state-relevant context settings only."""

from __future__ import annotations

import mmap
import os
import re
import shutil
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from snapcache.errors import ModelError
from snapcache.key import SnapshotKey
from snapcache.llama import capture_sequence, fingerprint, model_fingerprint
from snapcache.llama.fingerprint import file_fingerprint

_HEX = re.compile(r"[0-9a-f]{1,64}")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        value = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([value ^ 0xFF]))


def test_file_fingerprint_is_hex_and_stable(tiny_model_path: Path) -> None:
    value = file_fingerprint(tiny_model_path)
    assert _HEX.fullmatch(value)
    assert file_fingerprint(str(tiny_model_path)) == value


def test_copied_and_moved_files_keep_their_fingerprint(tiny_model_path: Path, tmp_path: Path) -> None:
    original = file_fingerprint(tiny_model_path)
    copy = _copy(tiny_model_path, tmp_path / "copy.gguf")
    assert file_fingerprint(copy) == original
    (tmp_path / "elsewhere").mkdir()
    moved = copy.rename(tmp_path / "elsewhere" / "renamed.gguf")
    assert file_fingerprint(moved) == original


def test_other_weights_give_another_fingerprint(
    tiny_model_path: Path, tiny_model_path_other_seed: Path
) -> None:
    assert file_fingerprint(tiny_model_path) != file_fingerprint(tiny_model_path_other_seed)


def test_one_changed_byte_changes_the_fingerprint(tiny_model_path: Path, tmp_path: Path) -> None:
    original = file_fingerprint(tiny_model_path)
    size = tiny_model_path.stat().st_size
    in_metadata = _copy(tiny_model_path, tmp_path / "meta.gguf")
    _flip_byte(in_metadata, in_metadata.read_bytes().index(b"tiny-llama-seed") + 2)
    in_tensors = _copy(tiny_model_path, tmp_path / "data.gguf")
    _flip_byte(in_tensors, size - 1000)
    assert file_fingerprint(in_metadata) != original
    assert file_fingerprint(in_tensors) != original


def test_sampled_mode_reads_every_small_tensor_and_pieces_of_large_ones(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """Past the header, each tensor is read whole up to 3 samples, else as its head, middle and tail."""
    size = tiny_model_path.stat().st_size
    with open(tiny_model_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        layout = fingerprint._parse_layout(data, size)
    assert 0 < layout.header_end <= layout.data_start < size
    assert len(layout.tensor_offsets) == 2 + 9 * 2 + 1  # embeddings, 9 per layer, output norm and matrix
    ranges = fingerprint._sampled_ranges(layout, size)
    assert ranges[0] == (0, layout.header_end)
    piece = fingerprint.TENSOR_SAMPLE_BYTES
    assert all(end - start in (piece,) or end - start <= 3 * piece for start, end in ranges[1:])
    assert ranges[-1][1] == size


def test_file_part_is_computed_once_per_file_identity(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real_hash = fingerprint._hash_file

    def counting(path: Path, size: int, mode: fingerprint.Content) -> bytes:
        calls.append(path)
        return real_hash(path, size, mode)

    monkeypatch.setattr(fingerprint, "_hash_file", counting)
    copy = _copy(tiny_model_path, tmp_path / "cached.gguf")
    first = file_fingerprint(copy)
    assert file_fingerprint(copy) == first
    assert len(calls) == 1
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert file_fingerprint(copy) == first
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"not a model at all, just some text" * 10, "not a GGUF"),
        (
            b"GGUF\x03\x00\x00\x00" + (5).to_bytes(8, "little") + (9).to_bytes(8, "little") + b"\xff" * 8,
            "malformed",
        ),
        (b"GGUF\x07\x00\x00\x00" + bytes(40), "version"),
    ],
)
def test_files_that_are_not_gguf_raise_model_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=message):
        file_fingerprint(path)


def test_missing_file_raises_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError):
        file_fingerprint(tmp_path / "absent.gguf")


@pytest.mark.model
def test_model_fingerprint_follows_content_not_path(
    make_llama: Any, tiny_model_path: Path, tiny_model_path_other_seed: Path, tmp_path: Path
) -> None:
    value = model_fingerprint(make_llama(tiny_model_path))
    assert _HEX.fullmatch(value)
    copy = _copy(tiny_model_path, tmp_path / "moved-model.gguf")
    assert model_fingerprint(make_llama(copy)) == value
    assert model_fingerprint(make_llama(tiny_model_path_other_seed)) != value


@pytest.mark.model
def test_size_and_speed_settings_do_not_change_the_fingerprint(
    make_llama: Any, tiny_model_path: Path
) -> None:
    base = model_fingerprint(make_llama(tiny_model_path, n_ctx=512))
    other = make_llama(tiny_model_path, n_ctx=1024, n_batch=64, n_ubatch=32, n_threads=1, n_threads_batch=1)
    assert model_fingerprint(other) == base


@pytest.mark.model
@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"type_k": llama_cpp.GGML_TYPE_Q8_0}, id="type_k-q8_0"),
        pytest.param({"type_k": llama_cpp.GGML_TYPE_F32}, id="type_k-f32"),
        pytest.param({"flash_attn": True}, id="flash-attn-on"),
        pytest.param({"rope_freq_base": 5000.0}, id="rope-base"),
        pytest.param({"embedding": True}, id="embeddings"),
    ],
)
def test_layout_settings_change_the_fingerprint(
    make_llama: Any, tiny_model_path: Path, settings: dict[str, Any]
) -> None:
    base = model_fingerprint(make_llama(tiny_model_path))
    assert model_fingerprint(make_llama(tiny_model_path, **settings)) != base


@pytest.mark.model
def test_snapshot_of_one_model_is_never_found_for_another(
    make_llama: Any, tiny_model_path: Path, tiny_model_path_other_seed: Path, store: Any
) -> None:
    source = make_llama(tiny_model_path)
    other = make_llama(tiny_model_path_other_seed)
    tokens = source.tokenize(b"The same prompt for two different models.")
    source.eval(tokens)
    captured = capture_sequence(source)
    fp_source, fp_other = model_fingerprint(source), model_fingerprint(other)
    store.put(SnapshotKey.for_tokens(fp_source, "default", captured.tokens), captured.tokens, captured.state)
    assert store.lookup(fp_other, "default", tokens) is None
    found = store.lookup(fp_source, "default", tokens)
    assert found is not None
    assert found.key.model_fingerprint == fp_source


@pytest.mark.model
@pytest.mark.gemma
@pytest.mark.slow
def test_gemma_fingerprint(make_llama: Any, gemma_model_path: Path, tiny_model_path: Path) -> None:
    base = model_fingerprint(make_llama(gemma_model_path, n_ctx=512))
    assert _HEX.fullmatch(base)
    assert model_fingerprint(make_llama(gemma_model_path, n_ctx=1024, n_batch=128)) == base
    assert model_fingerprint(make_llama(gemma_model_path, n_ctx=512, flash_attn=True)) != base
    assert model_fingerprint(make_llama(gemma_model_path, n_ctx=512, swa_full=False)) != base
    assert model_fingerprint(make_llama(tiny_model_path)) != base
