"""Which codec a tier stores each state with: its `Compression`, "auto", "zstd" or "none".

A read of a raw state of S bytes costs S/B, B the disk's speed; a compressed one r*S/B + S/D, r the
ratio and D the decode speed (about 2 GB/s on two cores). Compression gains time only on a disk
slower than (1 - r) * D. An 8B model's f16 K/V compresses to r = 0.84 (Gemma-3-270M's to 0.86): a
disk slower than 0.32 GB/s, slower than any SSD (and the page cache a restart often reads from is
faster still). So "auto" measures, once per model fingerprint (what decides a state's kind: its
layout and K/V type), what zstd makes of a sample of the first state it sees, and stores that
model's states raw unless zstd saves at least a quarter of their bytes (a third more states fit the
budget then). "zstd" always compresses (what a remote tier does: a network is slower than any
decode), "none" never does. Whatever a tier writes, it reads every codec any version wrote.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Literal, get_args

from snapcache.errors import InvalidArgument
from snapcache.formats import codec
from snapcache.formats.codec import RAW_CODEC, StateCodec
from snapcache.snapshot import Buffer, Snapshot

logger = logging.getLogger("snapcache.formats")

Compression = Literal["auto", "zstd", "none"]
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)
DEFAULT_COMPRESSION: Compression = "auto"
# "auto" keeps zstd for a kind of state it shrinks by at least this share.
WORTH_SAVING = 0.25
# What "auto" compresses to judge a kind of state: this much from the middle of its first state (the
# K/V rows, past the header), about 10 ms of one core.
SAMPLE_BYTES = 4 << 20
# A smaller state is judged for itself, and the model judged again on its next state.
JUDGES_A_MODEL_BYTES = 64 << 10

# A snapshot's payload under a codec: compressed now, or by the tier that asked first (store.shared_payloads).
PayloadSource = Callable[[Snapshot, StateCodec], Buffer]


def validate_compression(value: object) -> Compression:
    """`value` as a Compression, or InvalidArgument naming the choices."""
    for choice in COMPRESSIONS:
        if value == choice:
            return choice
    raise InvalidArgument(f"compression must be one of {', '.join(COMPRESSIONS)}, not {value!r}")


class CodecChoice:
    """The codec of each state a tier writes, under one Compression. Thread-safe."""

    def __init__(
        self,
        compression: Compression = DEFAULT_COMPRESSION,
        *,
        level: int = codec.DEFAULT_LEVEL,
        shuffle: bool = codec.DEFAULT_SHUFFLE,
    ) -> None:
        self.compression = validate_compression(compression)
        self._zstd = StateCodec(codec.NAME, codec.validate_level(level), bool(shuffle))
        self._by_fingerprint: dict[str, StateCodec] = {}
        self._lock = threading.Lock()

    def for_state(self, fingerprint: str, state: Buffer) -> StateCodec:
        """The codec for `state`, a state of the model `fingerprint`."""
        if self.compression == "zstd":
            return self._zstd
        if self.compression == "none":
            return RAW_CODEC
        with self._lock:
            known = self._by_fingerprint.get(fingerprint)
        if known is not None:
            return known
        saved = _share_saved(state, self._zstd)
        chosen = self._zstd if saved >= WORTH_SAVING else RAW_CODEC
        if memoryview(state).nbytes < JUDGES_A_MODEL_BYTES:
            return chosen
        with self._lock:
            known = self._by_fingerprint.setdefault(fingerprint, chosen)
        if known is not chosen:  # another thread judged this model meanwhile
            return known
        logger.info(
            "states of model %s: zstd saves %.0f%% of a sample, so they are stored %s",
            fingerprint[:12],
            100 * saved,
            "compressed" if chosen is self._zstd else "raw",
        )
        return chosen

    def chosen(self) -> dict[str, str]:
        """What "auto" chose so far: a codec name by model fingerprint."""
        with self._lock:
            return {fingerprint: found.name for fingerprint, found in self._by_fingerprint.items()}


def _share_saved(state: Buffer, zstd: StateCodec) -> float:
    """The share of a sample of `state` that zstd saves (0 for an empty state)."""
    view = memoryview(state).cast("B")
    start = max(0, view.nbytes // 2 - SAMPLE_BYTES // 2)
    sample = view[start : start + SAMPLE_BYTES]
    if not sample.nbytes:
        return 0.0
    return 1 - len(zstd.encode(sample)) / sample.nbytes
