"""Model fingerprints: from the file's content and the state-relevant context settings only."""

from __future__ import annotations

import mmap
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest
from tiny_model import control_vector, write_tiny_llama, write_tiny_lora, write_tiny_model

from snapcache.errors import InvalidArgument, ModelError
from snapcache.key import SnapshotKey
from snapcache.llama import capture_sequence, model_fingerprint
from snapcache.llama.exactness import fingerprint, model_files
from snapcache.llama.exactness.adapters import set_control_vector, set_lora_adapters
from snapcache.llama.exactness.fingerprint import file_fingerprint, shard_paths

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
        layout = model_files._parse_layout(data, size)
    assert 0 < layout.header_end <= layout.data_start < size
    assert len(layout.tensor_offsets) == 2 + 9 * 2 + 1  # embeddings, 9 per layer, output norm and matrix
    ranges = model_files._sampled_ranges(layout, size)
    assert ranges[0] == (0, layout.header_end)
    piece = model_files.TENSOR_SAMPLE_BYTES
    assert all(end - start in (piece,) or end - start <= 3 * piece for start, end in ranges[1:])
    assert ranges[-1][1] == size


def test_file_part_is_computed_once_per_file_identity(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real_hash = model_files._hash_file

    def counting(path: Path, size: int, mode: model_files.Content) -> bytes:
        calls.append(path)
        return real_hash(path, size, mode)

    monkeypatch.setattr(model_files, "_hash_file", counting)
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
    assert model_fingerprint(make_llama(gemma_model_path, n_ctx=512, swa_cache="full")) != base
    assert model_fingerprint(make_llama(tiny_model_path)) != base


# -- holes: two models or settings that differ must differ ------------------------------------------


def _edit_tensor(path: Path, name: str, edit: Callable[[npt.NDArray[Any]], None]) -> None:
    """Change one tensor of a GGUF file in place (the header stays as it was)."""
    reader = gguf.GGUFReader(path, "r+")
    (tensor,) = [t for t in reader.tensors if t.name == name]
    edit(tensor.data)
    tensor.data.flush()  # type: ignore[attr-defined]
    del reader


def _copy_split(first: Path, folder: Path) -> Path:
    folder.mkdir()
    for shard in shard_paths(first):
        shutil.copyfile(shard, folder / shard.name)
    return folder / first.name


def test_every_shard_of_a_split_model_counts(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first = write_tiny_model(tmp_path / "a" / "split.gguf", split_max_tensors=8)
    shards = shard_paths(first)
    assert [s.name for s in shards] == [f"split-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    other = _copy_split(first, tmp_path / "b")
    _edit_tensor(
        other.with_name("split-00003-of-00003.gguf"), "output.weight", lambda data: data.__imul__(-1)
    )
    assert other.read_bytes() == first.read_bytes()  # the first shard alone cannot tell them apart
    assert file_fingerprint(other) != file_fingerprint(first)
    assert file_fingerprint(_copy_split(first, tmp_path / "c")) == file_fingerprint(first)


def test_a_later_shard_or_a_missing_one_is_a_model_error(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    first = write_tiny_model(tmp_path / "m" / "split.gguf", split_max_tensors=8)
    with pytest.raises(ModelError, match="first shard"):
        file_fingerprint(first.with_name("split-00002-of-00003.gguf"))
    first.with_name("split-00003-of-00003.gguf").unlink()
    with pytest.raises(ModelError, match="cannot read"):
        file_fingerprint(first)


@pytest.mark.model
def test_split_model_loads_and_fingerprints_like_its_shards(make_llama: Any, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    first = write_tiny_model(tmp_path / "m" / "split.gguf", split_max_tensors=8)
    llm = make_llama(first)
    assert llm.create_completion("Hello", max_tokens=2)["choices"]
    assert _HEX.fullmatch(model_fingerprint(llm))


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama with 8192-wide feed-forward layers: about 13 MB, large tensors of 2 MB."""
    return write_tiny_llama(tmp_path_factory.mktemp("wide") / "wide.gguf", n_ff=8192)


def test_an_edit_of_one_small_tensor_changes_the_fingerprint(wide_llama: Path, tmp_path: Path) -> None:
    """Norm weights and biases are read whole, wherever they lie in a large file."""
    edited = _copy(wide_llama, tmp_path / "norm-edited.gguf")
    _edit_tensor(edited, "blk.1.attn_norm.weight", lambda data: data.__imul__(1.5))
    assert file_fingerprint(edited) != file_fingerprint(wide_llama)


def test_a_whole_large_tensor_edit_changes_the_fingerprint(wide_llama: Path, tmp_path: Path) -> None:
    edited = _copy(wide_llama, tmp_path / "ffn-edited.gguf")
    _edit_tensor(edited, "blk.0.ffn_up.weight", lambda data: data.__iadd__(0.01))
    assert file_fingerprint(edited) != file_fingerprint(wide_llama)


def test_full_content_mode_sees_an_edit_that_sampling_misses(
    wide_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default reads pieces of each large tensor; rows between them are covered by "full" only."""
    edited = _copy(wide_llama, tmp_path / "rows-edited.gguf")

    def edit_rows(data: npt.NDArray[Any]) -> None:
        # blk.0.ffn_up is 8192 rows of 64 floats (256 bytes): rows 1000-1010 lie past the first
        # 16 KiB piece and before the middle one.
        data[1000:1010] += 1.0

    _edit_tensor(edited, "blk.0.ffn_up.weight", edit_rows)
    assert file_fingerprint(edited) == file_fingerprint(wide_llama)
    assert file_fingerprint(edited, "full") != file_fingerprint(wide_llama, "full")
    assert file_fingerprint(wide_llama, "full") != file_fingerprint(wide_llama, "sampled")
    monkeypatch.setenv(fingerprint.CONTENT_ENV, "full")
    assert file_fingerprint(edited) == file_fingerprint(edited, "full")
    monkeypatch.setenv(fingerprint.CONTENT_ENV, "everything")
    with pytest.raises(InvalidArgument, match=fingerprint.CONTENT_ENV):
        file_fingerprint(edited)


@pytest.mark.model
def test_kv_overrides_change_the_fingerprint(make_llama: Any, tiny_model_path: Path) -> None:
    base = model_fingerprint(make_llama(tiny_model_path))
    key = "llama.attention.layer_norm_rms_epsilon"
    overridden = model_fingerprint(make_llama(tiny_model_path, kv_overrides={key: 1e-3}))
    assert overridden != base
    assert model_fingerprint(make_llama(tiny_model_path, kv_overrides={key: 1e-3})) == overridden
    assert model_fingerprint(make_llama(tiny_model_path, kv_overrides={key: 1e-4})) != overridden


@pytest.mark.model
def test_adapters_set_after_build_change_the_fingerprint(
    make_llama: Any, tiny_model_path: Path, tmp_path: Path
) -> None:
    lora_a = write_tiny_lora(tmp_path / "a.gguf", seed=1)
    lora_b = write_tiny_lora(tmp_path / "b.gguf", seed=2)
    llm = make_llama(tiny_model_path)
    base = model_fingerprint(llm)
    set_lora_adapters(llm, [(lora_a, 1.0)])
    with_a = model_fingerprint(llm)
    set_lora_adapters(llm, [(lora_a, 0.5)])
    half_a = model_fingerprint(llm)
    set_lora_adapters(llm, [(lora_b, 1.0)])
    with_b = model_fingerprint(llm)
    assert len({base, with_a, half_a, with_b}) == 4
    # The same adapter given at construction is the same fingerprint.
    assert model_fingerprint(make_llama(tiny_model_path, lora_path=str(lora_b))) == with_b
    set_lora_adapters(llm, [])
    assert model_fingerprint(llm) == base

    set_control_vector(llm, control_vector(64, seed=1))
    steered = model_fingerprint(llm)
    set_control_vector(llm, control_vector(64, seed=2))
    assert len({base, steered, model_fingerprint(llm)}) == 3
    set_control_vector(llm, control_vector(64, seed=1), first_layer=1, last_layer=1)
    assert model_fingerprint(llm) != steered
    set_control_vector(llm, None)
    assert model_fingerprint(llm) == base
    with pytest.raises(InvalidArgument, match="n_embd"):
        set_control_vector(llm, np.zeros(10, dtype=np.float32))


@pytest.mark.model
def test_adapters_change_what_llama_cpp_computes(
    make_llama: Any, tiny_model_path: Path, tmp_path: Path
) -> None:
    """The adapters the fingerprint follows really act: a restored state made without them would be wrong."""
    tokens = list(range(3, 60))
    llm = make_llama(tiny_model_path)

    def last_logits() -> npt.NDArray[np.float32]:
        llm.reset()
        llm.eval(tokens)
        n_vocab = int(llm.n_vocab())
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()

    plain = last_logits()
    set_lora_adapters(llm, [(write_tiny_lora(tmp_path / "lora.gguf"), 1.0)])
    assert not np.array_equal(last_logits(), plain)
    set_lora_adapters(llm, [])
    set_control_vector(llm, control_vector(64))
    assert not np.array_equal(last_logits(), plain)
    set_control_vector(llm, None)
    assert np.array_equal(last_logits(), plain)


@pytest.mark.model
def test_the_package_version_is_not_part_of_the_fingerprint_but_the_state_format_and_backend_are(
    tiny_llama: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = model_fingerprint(tiny_llama)
    monkeypatch.setattr(llama_cpp, "__version__", "0.3.99")
    assert model_fingerprint(tiny_llama) == base
    monkeypatch.setattr(llama_cpp, "LLAMA_STATE_SEQ_VERSION", llama_cpp.LLAMA_STATE_SEQ_VERSION + 1)
    assert model_fingerprint(tiny_llama) != base
    monkeypatch.undo()
    monkeypatch.setattr(fingerprint, "llama_system_info", lambda: "CPU : AVX2 = 0 |")
    assert model_fingerprint(tiny_llama) != base


@pytest.mark.model
def test_repeated_model_fingerprint_reads_no_file_again(
    tiny_llama: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cheap enough to call before every completion: after the first call, a stat and a few reads."""
    first = model_fingerprint(tiny_llama)

    def no_reading(*args: Any) -> Any:
        raise AssertionError("the model file was read again")

    monkeypatch.setattr(model_files, "_hash_file", no_reading)
    monkeypatch.setattr(model_files, "_read_layout", no_reading)
    assert model_fingerprint(tiny_llama) == first
