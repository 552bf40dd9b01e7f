"""The snapshot file: a checked envelope, then tokens, logits and the compressed state.

Layout (all integers little-endian)::

    envelope  prelude, JSON header (at most MAX_HEADER_BYTES), SHA-256, MAC (see formats.envelope)
    body      tokens (int32) | logits (float32) | payload (blosc2 chunks, or the raw state: see codec)

The header holds what the rest of the file must hash to, so its digest (or MAC) covers the whole
file: the SHA-256 of tokens and logits (a megabyte at most for today's vocabularies), and a digest
of the payload that is verified before a byte of it is decompressed. Every length is checked
against hard caps and against the file size before anything is decompressed.

The payload digest is XXH3-128 (xxhash): damage detection at memory speed (tens of GB/s, against
about 1 GB/s for SHA-256, bench_codec.py). XXH3 is no defence against a forger, and needs to be none
without a secret: anyone who can write the directory can write a whole valid file. With a secret the
payload digest is BLAKE3 instead, a cryptographic hash about twice as fast as SHA-256 here, so
that the HMAC-SHA256 of the header authenticates every byte of the file. The HMAC itself covers only
the small head, so its speed does not matter and it stays HMAC-SHA256.

Format version 1 (snapcache 0.1.0: one zstd frame carrying its own XXH64 checksum, and the SHA-256
of the payload with a secret) is still read, so an upgrade keeps every stored snapshot.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, BinaryIO

import blake3
import numpy as np
import xxhash

from snapcache.errors import CorruptSnapshot
from snapcache.formats import codec
from snapcache.formats.codec import StateCodec
from snapcache.formats.compression import CodecChoice, PayloadSource
from snapcache.formats.envelope import FLAG_MAC, PRELUDE, CheckedHead, MacMismatch, mac_key
from snapcache.formats.snapshot_fields import (
    FORMAT_VERSION,
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_LOGITS,
    MAX_STATE_BYTES,
    MAX_TOKENS,
    SNAPSHOT,
    checked_time_and_priority,
    file_tokens,
    header_key,
    key_fields,
    logits_count,
)
from snapcache.key import SnapshotKey, TokenArray
from snapcache.snapshot import Buffer, Snapshot

_V1_FRAME_CHECKSUM_BYTES = 4  # the last bytes of a zstd frame written with a content checksum
_CODEC_NAMES = {1: ("zstd",), FORMAT_VERSION: (codec.NAME, codec.RAW)}

__all__ = [
    "FLAG_MAC",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "MAX_LOGITS",
    "MAX_STATE_BYTES",
    "MAX_TOKENS",
    "PRELUDE",
    "SNAPSHOT",
    "EncodedFile",
    "Encoding",
    "FileHeader",
    "MacMismatch",
    "checked_time_and_priority",
    "decode",
    "encode",
    "file_tokens",
    "mac_key",
    "read_header",
]


@dataclass(frozen=True, slots=True)
class FileHeader:
    """What the head of a file says about it, checked (see read_header)."""

    key: SnapshotKey
    store_id: str
    priority: int
    created_at: float
    state_bytes: int
    file_bytes: int
    tokens: TokenArray
    authenticated: bool  # False: intact, but its MAC does not verify under the secret given (or none)


@dataclass(frozen=True, slots=True)
class _Head:
    header: dict[str, Any]
    key: SnapshotKey
    version: int
    has_mac: bool
    body_start: int
    file_bytes: int  # what the header says the whole file measures
    logits_count: int
    state_bytes: int
    priority: int
    created_at: float
    mac_problem: str | None  # why the MAC does not verify (read_header goes on; decode raises)


@dataclass(frozen=True, slots=True)
class EncodedFile:
    """A snapshot file ready to write: `parts` in order, `size` bytes in all."""

    parts: tuple[Buffer, ...]
    size: int
    state_bytes: int


def encode(
    snapshot: Snapshot,
    *,
    store_id: str,
    state_codec: StateCodec,
    mac_secret: bytes | None,
    payload: Buffer | None = None,
) -> EncodedFile:
    """Encode `snapshot`'s state with `state_codec` and lay out its file; `mac_secret` comes from
    mac_key(). `payload`: the state already encoded so (`state_codec.encode`), when tiers share one."""
    state = memoryview(snapshot.state).cast("B")
    tokens = np.ascontiguousarray(snapshot.tokens, dtype="<i4").data.cast("B")
    logits_shape: list[int] | None = None
    logits: Buffer = b""
    if snapshot.logits is not None:
        array = np.ascontiguousarray(snapshot.logits, dtype="<f4")
        logits_shape = [int(d) for d in array.shape]
        logits = array.data.cast("B")
    if payload is None:
        payload = state_codec.encode(state)
    body_digest = hashlib.sha256(tokens)
    body_digest.update(logits)
    key = snapshot.key
    header = {
        "key": key_fields(key),
        "store_id": store_id,
        "priority": snapshot.priority,
        "created_at": snapshot.created_at,
        "state_bytes": state.nbytes,
        "logits_shape": logits_shape,
        "logits_dtype": "<f4",
        "codec": state_codec.header(),
        "payload_bytes": memoryview(payload).nbytes,
        "body_sha256": body_digest.hexdigest(),
    }
    if mac_secret is None:
        header["payload_xxh3"] = xxhash.xxh3_128_hexdigest(payload)
    else:
        # XXH3 is no authentication: a cryptographic digest lets the MAC reach the payload.
        header["payload_blake3"] = blake3.blake3(payload).hexdigest()
    parts: tuple[Buffer, ...] = (
        SNAPSHOT.head(FORMAT_VERSION, header, mac_secret, too_large=CorruptSnapshot),
        tokens,
        logits,
        payload,
    )
    size = sum(memoryview(p).nbytes for p in parts)
    return EncodedFile(parts=parts, size=size, state_bytes=state.nbytes)


@dataclass(frozen=True, slots=True)
class Encoding:
    """How one tier encodes its snapshots: its store id, codecs and MAC key."""

    store_id: str
    codecs: CodecChoice
    mac_secret: bytes | None

    def codec_for(self, snapshot: Snapshot) -> StateCodec:
        """The codec `snapshot`'s state is stored with."""
        return self.codecs.for_state(snapshot.key.model_fingerprint, snapshot.state)

    def encode(self, snapshot: Snapshot, source: PayloadSource | None = None) -> EncodedFile:
        """`encode(snapshot)` with its codec, its state encoded by `source` (the store's shared
        payloads) where given."""
        state_codec = self.codec_for(snapshot)
        return encode(
            snapshot,
            store_id=self.store_id,
            state_codec=state_codec,
            mac_secret=self.mac_secret,
            payload=None if source is None else source(snapshot, state_codec),
        )


def decode(
    data: Buffer,
    *,
    key: SnapshotKey,
    store_id: str,
    mac_secret: bytes | None,
    max_state_bytes: int = MAX_STATE_BYTES,
    state_into: memoryview | None = None,
) -> Snapshot:
    """Verify a whole file read into memory and return its snapshot, which holds copies of what it
    keeps: `data` may be overwritten once this returns, unless `state_into` is given.

    `state_into`: a writable buffer a compressed state is decoded into instead of new memory, when
    it is large enough (format 2); the snapshot's state is then a view of it, or of `data` itself
    when the state is stored raw (see codec.decoded): valid while both buffers are.

    Raises MacMismatch for an intact file authenticated otherwise, CorruptSnapshot for the rest.
    """
    view = memoryview(data).cast("B")
    checked = SNAPSHOT.check(view, mac_secret, refuse=MacMismatch)
    head = _checked_fields(checked, max_state_bytes, expected_key=key)
    header = head.header
    if header["store_id"] != store_id:
        raise CorruptSnapshot("file belongs to another store")
    if head.file_bytes != view.nbytes:
        raise CorruptSnapshot(f"file is {view.nbytes} bytes, its header describes {head.file_bytes}")
    body_start = head.body_start
    tokens_end = body_start + 4 * key.token_count
    logits_end = tokens_end + 4 * head.logits_count
    expected_body = SNAPSHOT.digest_field(header, "body_sha256", 32)
    if not hmac.compare_digest(hashlib.sha256(view[body_start:logits_end]).digest(), expected_body):
        raise CorruptSnapshot("tokens or logits checksum mismatch")
    payload = view[logits_end:]
    _verify_payload(head, payload)

    tokens = file_tokens(view[body_start:tokens_end])
    if not key.matches(tokens):
        raise CorruptSnapshot("tokens do not hash to the key")
    logits = None
    shape = header.get("logits_shape")
    if isinstance(shape, list):
        logits = np.frombuffer(bytes(view[tokens_end:logits_end]), dtype="<f4").reshape(shape)
    if head.version == 1:  # zstd checks the frame checksum (XXH64 of the state) while decoding
        shuffle = SNAPSHOT.field(header, "codec", dict)["shuffle"] == 2
        state = codec.decompress_zstd_frame(payload, expected_size=head.state_bytes, shuffle=shuffle)
    else:
        state_codec = StateCodec.of_header(SNAPSHOT.field(header, "codec", dict))
        state = codec.decoded(state_codec, payload, head.state_bytes, state_into)
    return Snapshot(
        key=key,
        tokens=tokens,
        state=state,
        logits=logits,
        priority=head.priority,
        created_at=head.created_at,
    )


def _verify_payload(head: _Head, payload: memoryview) -> None:
    """Check the payload against the digest in the (verified) header, before it is decompressed."""
    header = head.header
    if head.version == 1:
        checksum = SNAPSHOT.field(header, "payload_checksum", str)
        if payload.nbytes < _V1_FRAME_CHECKSUM_BYTES or (
            payload[-_V1_FRAME_CHECKSUM_BYTES:].hex() != checksum
        ):
            raise CorruptSnapshot("payload checksum differs from the header")
        if head.has_mac and not hmac.compare_digest(
            hashlib.sha256(payload).digest(), SNAPSHOT.digest_field(header, "payload_sha256", 32)
        ):
            raise CorruptSnapshot("payload checksum mismatch")
    elif head.has_mac:
        if not hmac.compare_digest(
            blake3.blake3(payload).digest(), SNAPSHOT.digest_field(header, "payload_blake3", 32)
        ):
            raise CorruptSnapshot("payload checksum mismatch (BLAKE3)")
    elif not hmac.compare_digest(
        xxhash.xxh3_128_digest(payload), SNAPSHOT.digest_field(header, "payload_xxh3", 16)
    ):
        raise CorruptSnapshot("payload checksum differs from the header (XXH3-128)")


def read_header(file: BinaryIO, file_bytes: int, *, mac_secret: bytes | None) -> FileHeader:
    """Check the head and the tokens of an open file without reading its payload.

    What rebuilding a lost index needs: the header's digest (and MAC), its fields, the size it
    describes against `file_bytes`, and tokens that hash to its key. The payload is verified when the
    snapshot is read. A MAC that does not verify is reported in `authenticated`, not raised;
    everything else raises CorruptSnapshot.
    """
    head = _checked_fields(SNAPSHOT.read(file, mac_secret), MAX_STATE_BYTES)
    if head.file_bytes != file_bytes:
        raise CorruptSnapshot(f"file is {file_bytes} bytes, its header describes {head.file_bytes}")
    key = head.key
    file.seek(head.body_start)
    raw = file.read(4 * key.token_count)
    if len(raw) != 4 * key.token_count:
        raise CorruptSnapshot("file is truncated inside its tokens")
    tokens = file_tokens(raw)
    if not key.matches(tokens):
        raise CorruptSnapshot("tokens do not hash to the key")
    return FileHeader(
        key=key,
        store_id=SNAPSHOT.field(head.header, "store_id", str),
        priority=head.priority,
        created_at=head.created_at,
        state_bytes=head.state_bytes,
        file_bytes=file_bytes,
        tokens=tokens,
        authenticated=head.mac_problem is None,
    )


def _checked_fields(
    checked: CheckedHead, max_state_bytes: int, expected_key: SnapshotKey | None = None
) -> _Head:
    """The fields of a checked head, checked (the key `expected_key` when one is given), and the size
    they describe."""
    header = checked.header
    key = header_key(header, expected_key)
    codec_info = SNAPSHOT.field(header, "codec", dict)
    if SNAPSHOT.field(codec_info, "name", str) not in _CODEC_NAMES[checked.version]:
        raise CorruptSnapshot("unknown codec")
    if SNAPSHOT.field(codec_info, "shuffle", int) not in (0, 2):
        raise CorruptSnapshot(f"unknown shuffle {codec_info['shuffle']}")
    state_bytes = SNAPSHOT.bounded(header, "state_bytes", min(max_state_bytes, MAX_STATE_BYTES))
    payload_bytes = SNAPSHOT.bounded(header, "payload_bytes", MAX_STATE_BYTES)
    n_logits = logits_count(header)
    priority, created_at = checked_time_and_priority(header)
    SNAPSHOT.field(header, "store_id", str)
    body_start = checked.body_start
    return _Head(
        header=header,
        key=key,
        version=checked.version,
        has_mac=checked.has_mac,
        body_start=body_start,
        file_bytes=body_start + 4 * key.token_count + 4 * n_logits + payload_bytes,
        logits_count=n_logits,
        state_bytes=state_bytes,
        priority=priority,
        created_at=created_at,
        mac_problem=checked.mac_problem,
    )
