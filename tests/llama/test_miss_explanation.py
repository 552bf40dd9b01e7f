"""Why a prompt missed: the divergence from the closest snapshot, or the fingerprint part that differs."""

from __future__ import annotations

import json
import subprocess
import sys

import llama_cpp
import pytest
from chat_support import GREEDY, N_CTX, SYSTEM, chat

import snapcache

pytestmark = pytest.mark.model


def test_a_changed_word_is_named_with_its_position_and_text(make_llama, tiny_model_path, store) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    hook = snapcache.attach(llm, store, scope="agent")
    llm.create_chat_completion(messages=chat(SYSTEM, "Hello."), **GREEDY)
    changed = SYSTEM.replace("plainly", "politely", 1)
    llm2 = make_llama(tiny_model_path, n_ctx=N_CTX)
    hook2 = snapcache.attach(llm2, store, scope="agent")
    llm2.create_chat_completion(messages=chat(changed, "Hello."), **GREEDY)

    why = hook2.explain()
    assert why is not None
    assert why.closest is not None
    first_difference = next(i for i, (a, b) in enumerate(zip(SYSTEM, changed, strict=True)) if a != b)
    # The tiny model reads one byte a token, after the BOS and the template's opening tokens.
    assert why.diverged_at is not None
    assert why.matched_tokens == why.diverged_at
    assert why.restored_tokens <= why.diverged_at
    assert first_difference < why.diverged_at < first_difference + 64  # after the template's opening
    assert why.prompt_text.startswith("olitely")
    assert why.stored_text.startswith("lainly")
    assert "at token" in why.reason
    assert hook.explain(scope="other") is None


def test_another_kv_type_is_named(make_llama, tiny_model_path, store) -> None:
    writer = make_llama(tiny_model_path, n_ctx=N_CTX)
    snapcache.CachedLlama(writer, store, "agent").warm(SYSTEM)
    reader = make_llama(tiny_model_path, n_ctx=N_CTX, type_k=llama_cpp.GGML_TYPE_Q8_0)
    why = snapcache.CachedLlama(reader, store, "agent").explain_prompt(SYSTEM)
    assert why.closest is None
    assert why.restored_tokens == 0
    assert why.other_fingerprints == (snapcache.model_fingerprint(writer),)
    assert why.differing_parts == ("the K cache type",)
    assert "another model fingerprint" in why.reason


def test_a_stored_prefix_explains_itself(make_llama, tiny_model_path, store) -> None:
    llm = make_llama(tiny_model_path, n_ctx=N_CTX)
    cached = snapcache.CachedLlama(llm, store, "agent")
    warmed = cached.warm(SYSTEM)
    why = cached.explain_prompt(SYSTEM)
    assert why.restored_tokens == warmed.token_count
    assert why.diverged_at is None
    assert why.reason.startswith("restored the longest stored prefix")
    empty = snapcache.CachedLlama(llm, store, "nobody").explain_prompt(SYSTEM)
    assert empty.reason == "nothing is stored in this scope yet"


def test_the_why_command_names_the_divergence(tiny_model_path, tmp_path) -> None:
    stored, asked = tmp_path / "stored.txt", tmp_path / "asked.txt"
    stored.write_text(SYSTEM)
    asked.write_text(SYSTEM.replace("briefly", "at length", 1))
    base = [sys.executable, "-m", "snapcache", "--cache-dir", str(tmp_path / "cache")]
    model = ["--model", str(tiny_model_path), "--n-ctx", str(N_CTX), "--raw"]
    subprocess.run([*base, "warm", str(stored), *model], check=True, capture_output=True, timeout=120)
    shown = subprocess.run([*base, "why", str(asked), *model], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.replace("\u2581", " ")  # the tiny model's vocabulary spells spaces so
    assert "diverges at:" in text
    assert "|at length" in text
    assert "|briefly" in text
    as_json = subprocess.run(
        [*base, "why", str(asked), *model, "--json"], capture_output=True, text=True, timeout=120
    )
    document = json.loads(as_json.stdout)
    assert document["diverged_at"] == document["matched_tokens"] > 0
    assert document["restored_tokens"] <= document["diverged_at"]
