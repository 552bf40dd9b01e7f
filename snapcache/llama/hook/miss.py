"""Why a prompt restored less than hoped: the closest stored snapshot, and where it parts ways.

Two reasons cover nearly every surprise. The prompt is not what was stored: another chat template,
a date in the system prompt, a changed word; the explanation names the token where the prompt and
the closest snapshot of its model and scope diverge, and shows a little text on both sides. Or the
model is not what was stored: another file, another K/V type, flash attention, an adapter, a new
llama.cpp; the explanation names the fingerprint parts that differ (see `fingerprint_notes`).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import llama_cpp
import numpy as np

from snapcache.key import SnapshotKey, TokenArray
from snapcache.llama.exactness.fingerprint_notes import FingerprintNotes
from snapcache.llama.templates.chat_prefix import common_prefix
from snapcache.store import SnapshotStore

__all__ = ["MissExplanation", "explain_prompt"]

# The newest snapshots looked at: enough for any real scope, and a bound on the work.
_MAX_CANDIDATES = 256
_EXCERPT_TOKENS = 12
_PART_NAMES = {
    "model": "the model file's content",
    "context.type_k": "the K cache type",
    "context.type_v": "the V cache type",
    "context.v_transposed": "flash attention (the V cache layout)",
    "context.n_seq_max": "the number of sequences",
    "context.kv_unified": "the unified KV setting",
    "context.embeddings": "embeddings mode",
    "context.n_swa": "the sliding window",
    "context.swa_full": "the sliding-window cache's size (swa_full, --swa-cache)",
    "context.rope": "the RoPE settings",
    "kv_overrides": "kv_overrides",
    "adapters": "the LoRA adapters or control vector",
    "numerics": "the llama.cpp build (CPU features) or the GPU layers",
    "state_seq_version": "llama.cpp's state format",
    "restore": "exact=False (inexact states are kept apart)",
}


@dataclass(frozen=True, slots=True)
class MissExplanation:
    """What the store holds for one prompt, and why the rest had to be read.

    `closest` is the stored snapshot of the same model fingerprint and scope that shares the longest
    beginning with the prompt (`matched_tokens` of them); `diverged_at` is the first prompt token it
    does not share (None when the snapshot is a whole prefix of the prompt, or there is none), with
    a little decoded text before it and on each side after it. `other_fingerprints` hold snapshots
    in the same scope; `differing_parts` names what differs from the newest of them, where known.
    """

    scope: str
    model_fingerprint: str
    prompt_tokens: int
    restored_tokens: int
    closest: SnapshotKey | None
    matched_tokens: int
    diverged_at: int | None
    text_before: str
    prompt_text: str
    stored_text: str
    other_fingerprints: tuple[str, ...]
    differing_parts: tuple[str, ...]
    reason: str

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the closest snapshot by its key id, tuples as lists."""
        document = asdict(self)
        document["closest"] = None if self.closest is None else self.closest.id
        document["other_fingerprints"] = list(self.other_fingerprints)
        document["differing_parts"] = list(self.differing_parts)
        return document


def explain_prompt(
    llm: llama_cpp.Llama,
    store: SnapshotStore,
    notes: FingerprintNotes,
    fingerprint: str,
    scope: str,
    tokens: TokenArray,
    restored_tokens: int,
    *,
    stored_before: float | None = None,
) -> MissExplanation:
    """Explain what `store` holds for `tokens` in this fingerprint and scope (see MissExplanation).

    `stored_before`: only snapshots created before this time count (the completion being explained
    saved its own afterwards).
    """
    closest, matched, stored = _closest(store, fingerprint, scope, tokens, stored_before)
    diverged = None
    before = prompt_text = stored_text = ""
    if stored is not None and matched < min(len(stored), len(tokens)):
        diverged = matched
        before = _decode(llm, tokens[max(0, matched - _EXCERPT_TOKENS) : matched])
        prompt_text = _decode(llm, tokens[matched : matched + _EXCERPT_TOKENS])
        stored_text = _decode(llm, stored[matched : matched + _EXCERPT_TOKENS])
    others = _other_fingerprints(store, fingerprint, scope)
    differing = _differing_parts(notes.recall(fingerprint), notes.recall(others[0])) if others else ()
    reason = _reason(len(tokens), restored_tokens, closest, matched, diverged, others, differing)
    return MissExplanation(
        scope,
        fingerprint,
        len(tokens),
        restored_tokens,
        closest,
        matched,
        diverged,
        before,
        prompt_text,
        stored_text,
        others,
        differing,
        reason,
    )


def _closest(
    store: SnapshotStore, fingerprint: str, scope: str, tokens: TokenArray, stored_before: float | None
) -> tuple[SnapshotKey | None, int, TokenArray | None]:
    entries = [
        entry
        for entry in store.entries(model_fingerprint=fingerprint, scope=scope)
        if stored_before is None or entry.created_at < stored_before
    ]
    entries.sort(key=lambda e: e.last_used_at, reverse=True)
    best: tuple[SnapshotKey | None, int, TokenArray | None] = (None, 0, None)
    for entry in entries[:_MAX_CANDIDATES]:
        stored = store.stored_tokens(entry.key)
        if stored is None:
            continue
        matched = common_prefix(np.asarray(stored), tokens)
        best_length = 0 if best[2] is None else len(best[2])
        if best[0] is None or matched > best[1] or (matched == best[1] and len(stored) > best_length):
            best = (entry.key, matched, stored)
    return best


def _other_fingerprints(store: SnapshotStore, fingerprint: str, scope: str) -> tuple[str, ...]:
    """Other fingerprints with snapshots in this scope, most recently used first."""
    newest: dict[str, float] = {}
    for entry in store.entries(scope=scope):
        other = entry.key.model_fingerprint
        if other != fingerprint:
            newest[other] = max(newest.get(other, 0.0), entry.last_used_at)
    return tuple(sorted(newest, key=lambda f: newest[f], reverse=True))


def _differing_parts(mine: dict[str, Any] | None, theirs: dict[str, Any] | None) -> tuple[str, ...]:
    if mine is None or theirs is None:
        return ()
    differing = []
    for name in sorted(set(mine) | set(theirs)):
        a, b = mine.get(name), theirs.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            differing += [f"{name}.{sub}" for sub in sorted(set(a) | set(b)) if a.get(sub) != b.get(sub)]
        elif a != b:
            differing.append(name)
    return tuple(_PART_NAMES.get(name, name) for name in differing)


def _reason(
    n: int,
    restored: int,
    closest: SnapshotKey | None,
    matched: int,
    diverged: int | None,
    others: tuple[str, ...],
    differing: tuple[str, ...],
) -> str:
    if closest is None:
        if not others:
            return "nothing is stored in this scope yet"
        what = ", ".join(differing) if differing else "the model or a setting that changes its state"
        return f"this scope holds snapshots of another model fingerprint only; what differs: {what}"
    if diverged is not None and matched < n:
        return (
            f"the prompt differs from the closest snapshot ({closest.token_count} tokens) "
            f"at token {diverged}; {restored} restored"
        )
    if restored < matched:
        return (
            f"the closest snapshot matches {matched} tokens but {restored} were restored: it did not fit "
            "in the context, failed its checks, or was evicted"
        )
    return f"restored the longest stored prefix ({restored} of {n} tokens)"


def _decode(llm: llama_cpp.Llama, tokens: Any) -> str:
    """The text of `tokens`, each run of ids outside the vocabulary (an image's key tokens) shown as
    `[image]`: llama.cpp's detokenizer aborts the process on such an id."""
    n_vocab = int(llm.n_vocab())
    pieces: list[str] = []
    for in_vocabulary, run in itertools.groupby((int(t) for t in tokens), lambda t: 0 <= t < n_vocab):
        if not in_vocabulary:
            pieces.append("[image]")
            continue
        try:
            pieces.append(bytes(llm.detokenize(list(run))).decode("utf-8", "replace"))
        except Exception:  # show nothing rather than fail the explanation
            pieces.append("")
    return "".join(pieces)
