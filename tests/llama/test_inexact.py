"""`exact=False`: states restored at any token, also where no restore is exact, under their own fingerprint.

How far an inexact restore drifts from a cold run is measured by benchmarks/bench_inexact.py, not
asserted here: these tests pin what it restores, where its states live, and that on a model whose
splits are all exact (the tiny llama's f32 weights) it still answers as a cold run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from snapcache.llama.exactness.fingerprint import model_fingerprint
from snapcache.llama.exactness.support import FLASH_ATTN_REASON
from snapcache.llama.hook.cached import CachedLlama
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

N_CTX = 1024
GREEDY: dict[str, Any] = {"max_tokens": 12, "temperature": 0.0}
FIRST = "Ledger: the shop sold three lamps, two chairs and a table before noon on market day. " * 5
SECOND = FIRST + "Question: how many chairs were sold?"


def _ask(model: Any, prompt: str) -> str:
    return str(model.create_completion(prompt, **GREEDY)["choices"][0]["text"])


def _prompt_tokens(llm: Any, prompt: str) -> int:
    return len(llm.tokenize(prompt.encode()))


def test_an_inexact_cache_restores_every_token_but_the_last_and_answers_as_cold_where_splits_are_exact(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    cold = _ask(make_llama(tiny_model_path, n_ctx=N_CTX), SECOND)

    exact = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, scope="exact")
    _ask(exact, FIRST)
    exact.llm.reset()
    assert _ask(exact, SECOND) == cold
    assert exact.last_restore is not None
    exact_restored = exact.last_restore.cached_tokens

    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    inexact = CachedLlama(llm, store, scope="inexact", exact=False)
    assert not inexact.exact
    assert inexact.alignment == 1
    _ask(inexact, FIRST)
    llm.reset()  # from the store, not the live context
    assert _ask(inexact, SECOND) == cold
    assert inexact.last_restore is not None
    assert inexact.last_restore.source in ("ram", "disk")
    assert inexact.last_restore.cached_tokens == _prompt_tokens(llm, FIRST) - 1
    assert inexact.last_restore.cached_tokens > exact_restored  # the exact tail of 32 or more, read again


def test_exact_and_inexact_states_never_serve_each_other(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    writer = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, exact=False)
    _ask(writer, FIRST)
    reader = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, save=False)
    assert reader.fingerprint != writer.fingerprint
    _ask(reader, SECOND)
    assert reader.last_restore is not None
    assert reader.last_restore.cached_tokens == 0

    exact_writer = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, scope="other")
    _ask(exact_writer, FIRST)
    inexact_reader = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, scope="other", exact=False)
    _ask(inexact_reader, SECOND)
    assert inexact_reader.last_restore is not None
    assert inexact_reader.last_restore.cached_tokens == 0

    why = reader.explain()
    assert why is not None
    assert why.other_fingerprints == (writer.fingerprint,)
    assert why.differing_parts == ("exact=False (inexact states are kept apart)",)


def test_flash_attention_over_f16_is_a_miss_when_exact_and_restored_when_not(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="snapcache")
    exact = CachedLlama(
        make_llama(tiny_model_path, n_ctx=N_CTX, flash_attn=True), store, scope="fa", exact=True
    )
    _ask(exact, FIRST)
    exact.llm.reset()
    _ask(exact, SECOND)
    assert exact.last_restore is not None
    assert exact.last_restore.cached_tokens == 0
    assert FLASH_ATTN_REASON in caplog.text
    assert not store.entries(blocks=True)

    cold = _ask(make_llama(tiny_model_path, n_ctx=N_CTX, flash_attn=True), SECOND)
    llm = make_llama(tiny_model_path, n_ctx=N_CTX, flash_attn=True)
    inexact = CachedLlama(llm, store, scope="fa", exact=False)
    _ask(inexact, FIRST)
    llm.reset()
    answer = _ask(inexact, SECOND)
    assert inexact.last_restore is not None
    assert inexact.last_restore.cached_tokens == _prompt_tokens(llm, FIRST) - 1
    assert (
        inexact.last_restore.evaluated_tokens == _prompt_tokens(llm, SECOND) - _prompt_tokens(llm, FIRST) + 1
    )
    # The answers are not asserted equal: that is the drift `exact=False` accepts, measured by
    # benchmarks/bench_inexact.py. Both answered.
    assert answer
    assert cold


def test_serve_options_carry_exact_false_to_the_engine(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from snapcache.server import ServeOptions, create_app

    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    with TestClient(create_app(llm, store, ServeOptions(exact=False, parallel=1))) as client:
        stats = client.get("/snapcache/stats").json()
    assert stats["exactness"]["mode"] == "inexact"
    assert stats["exactness"]["asked"] is False


def test_an_exact_cache_never_reads_on_from_a_context_an_inexact_one_left(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    inexact = CachedLlama(llm, store, scope="same", exact=False)
    _ask(inexact, FIRST)
    strict = CachedLlama(llm, store, scope="same")
    _ask(strict, SECOND)  # shares FIRST with the context, read there from an inexact restore point
    assert strict.last_restore is not None
    assert strict.last_restore.source is None
    assert strict.last_restore.cached_tokens == 0
    # And what it saved is under its own fingerprint only.
    assert {e.key.model_fingerprint for e in store.entries(blocks=True)} == {
        inexact.fingerprint,
        strict.fingerprint,
    }


def test_states_follow_the_fingerprint_when_a_control_vector_is_set_after_the_hook(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    from tiny_model import N_EMBD, control_vector

    from snapcache.llama.exactness.adapters import set_control_vector

    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    cached = CachedLlama(llm, store)
    before = cached.fingerprint
    set_control_vector(llm, control_vector(N_EMBD, seed=3))
    llm.reset()
    _ask(cached, FIRST)
    assert cached.fingerprint != before
    assert {e.key.model_fingerprint for e in store.entries(blocks=True)} == {cached.fingerprint}
    # The context read before the change is not reused after it either.
    set_control_vector(llm, None)
    _ask(cached, SECOND)
    assert cached.last_restore is not None
    assert cached.last_restore.source is None


# -- exact="auto", the default ---------------------------------------------------------------------


def test_auto_is_exact_on_a_cpu_build_under_the_exact_fingerprint(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    cached = CachedLlama(llm, store, scope="auto")
    assert cached.exactness.exact
    assert cached.exactness.asked == "auto"
    assert "bit for bit" in cached.exactness.reason
    assert cached.fingerprint == model_fingerprint(llm, exact=True)
    # The same states as exact=True: what one stores, the other restores.
    _ask(cached, FIRST)
    other = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, scope="auto", exact=True)
    _ask(other, SECOND)
    assert other.last_restore is not None
    assert other.last_restore.cached_tokens > 0


def test_auto_restores_inexactly_under_flash_attention_over_f16_and_says_so_once(
    make_llama: Any, tiny_model_path: Path, store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="snapcache")
    llm = make_llama(tiny_model_path, n_ctx=N_CTX, flash_attn=True)
    cached = CachedLlama(llm, store, scope="auto-fa")
    assert not cached.exactness.exact
    assert "flash attention" in cached.exactness.reason
    assert cached.fingerprint == model_fingerprint(llm, exact=False)
    _ask(cached, FIRST)
    llm.reset()
    _ask(cached, SECOND)
    assert cached.last_restore is not None
    assert cached.last_restore.cached_tokens == _prompt_tokens(llm, FIRST) - 1
    CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX, flash_attn=True), store, scope="auto-fa")
    told = [r for r in caplog.records if r.getMessage().startswith("exactness: inexact (auto")]
    assert len(told) == 1, [r.getMessage() for r in told]
    assert told[0].levelno == logging.WARNING


def test_auto_restores_inexactly_where_the_probe_finds_no_split_point(
    make_llama: Any, tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a CUDA build measures (no split point keeps its results bit for bit), injected."""
    from snapcache.llama.exactness import alignment

    monkeypatch.setattr(alignment, "_measured", {})
    monkeypatch.setattr(alignment, "measure_alignment", lambda llm: None)
    with SnapshotStore(tmp_path / "cache") as store:
        llm = make_llama(tiny_model_path, n_ctx=N_CTX)
        cached = CachedLlama(llm, store, scope="no-split")
        assert not cached.exactness.exact
        assert (
            cached.exactness.reason
            == "no prompt split point keeps this llama.cpp build's results bit for bit"
        )
        _ask(cached, FIRST)
        llm.reset()
        _ask(cached, SECOND)
        assert cached.last_restore is not None
        assert cached.last_restore.cached_tokens == _prompt_tokens(llm, FIRST) - 1

        insisting = CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, scope="no-split", exact=True)
        _ask(insisting, SECOND)
        assert insisting.last_restore is not None
        assert insisting.last_restore.cached_tokens == 0  # exact=True caches nothing there


def test_exact_must_be_a_bool_or_auto(make_llama: Any, tiny_model_path: Path, store: SnapshotStore) -> None:
    from snapcache.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="exact must be True, False or 'auto'"):
        CachedLlama(make_llama(tiny_model_path, n_ctx=N_CTX), store, exact="yes")  # type: ignore[arg-type]
