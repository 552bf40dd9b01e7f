"""The pack file: the blocks one save writes, behind one checked header (format version 3).

Layout (all integers little-endian)::

    envelope  prelude (the snapshot file's magic, format version 3), JSON header, SHA-256, MAC (see
              formats.envelope); the header holds what the members share (store, fingerprint,
              priority, time, codec) and, per member, its scope, token count, prefix hash, state and
              payload sizes and digest
    body      per member, in order: tokens (int32) | payload (blosc2 chunks, or the raw state: see codec)

A restore of many blocks then opens, reads and checks one header for many of them: per block only its
bytes are read and its digest checked. A member's digest (XXH3-128, or BLAKE3 with a secret, as in
formats.snapshot_file) covers its tokens and payload, so the checked header reaches every byte of the file.
Members carry no logits. In the index each block has its own row, whose bytes are its share of the
pack (see disk.index): the pack is deleted with its last row.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import blake3
import numpy as np
import xxhash

from snapcache.errors import CorruptSnapshot
from snapcache.formats import codec
from snapcache.formats.codec import StateCodec
from snapcache.formats.envelope import CheckedHead, Envelope, MacMismatch, read_exactly
from snapcache.formats.snapshot_file import (
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_STATE_BYTES,
    MAX_TOKENS,
    checked_time_and_priority,
    file_tokens,
)
from snapcache.key import SnapshotKey, TokenArray
from snapcache.snapshot import Buffer, Snapshot

PACK_VERSION = 3
# At most this many members: a header of 64 KiB names them all with room to spare.
MAX_MEMBERS = 128
# What a writer packs into one file at most: this many blocks, this much state (and, in a disk tier,
# an eighth of its budget: eviction frees whole packs, so they stay small beside the budget).
PACK_MEMBERS = 64
PACK_STATE_BYTES = 16 << 20
PACK = Envelope(MAGIC, (PACK_VERSION,), MAX_HEADER_BYTES, "pack")


class PackTooLarge(ValueError):
    """The header of a pack of these snapshots would exceed MAX_HEADER_BYTES: pack fewer."""


@dataclass(frozen=True, slots=True)
class PackMember:
    """One member as the checked header describes it; `offset` and `size` place its tokens and
    payload in the file."""

    key: SnapshotKey
    offset: int
    size: int
    state_bytes: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class PackHead:
    """The checked head of a pack file."""

    store_id: str
    priority: int
    created_at: float
    state_codec: StateCodec
    members: tuple[PackMember, ...]
    file_bytes: int  # what the header says the whole file measures
    has_mac: bool
    authenticated: bool  # False: intact, but its MAC does not verify under the secret given (or none)
    shares: tuple[int, ...]  # each member's share of the file's bytes: they sum to file_bytes
    by_key: dict[SnapshotKey, PackMember]

    def member(self, key: SnapshotKey) -> PackMember | None:
        return self.by_key.get(key)


@dataclass(frozen=True, slots=True)
class EncodedPack:
    """A pack file ready to write: `parts` in order, `size` bytes in all; `shares[i]` is member i's
    share of them (its tokens and payload, and a part of the head)."""

    parts: tuple[Buffer, ...]
    size: int
    shares: tuple[int, ...]
    state_bytes: tuple[int, ...]


def encode_pack(
    snapshots: list[Snapshot],
    *,
    store_id: str,
    state_codec: StateCodec,
    mac_secret: bytes | None,
    payloads: Sequence[Buffer] | None = None,
) -> EncodedPack:
    """Encode `snapshots` (one fingerprint, one priority, no logits) with `state_codec` into one pack
    file; `payloads`: their states already encoded so, when tiers share them."""
    if not 0 < len(snapshots) <= MAX_MEMBERS:
        raise ValueError(f"a pack holds 1 to {MAX_MEMBERS} snapshots, not {len(snapshots)}")
    first = snapshots[0]
    fingerprint = first.key.model_fingerprint
    members: list[dict[str, Any]] = []
    body: list[Buffer] = []
    bodies: list[int] = []
    state_sizes: list[int] = []
    for i, snapshot in enumerate(snapshots):
        key = snapshot.key
        if key.model_fingerprint != fingerprint or snapshot.priority != first.priority:
            raise ValueError("a pack holds snapshots of one fingerprint and one priority")
        if snapshot.logits is not None:
            raise ValueError("a pack holds no logits")
        state = memoryview(snapshot.state).cast("B")
        tokens = np.ascontiguousarray(snapshot.tokens, dtype="<i4").data.cast("B")
        payload = state_codec.encode(state) if payloads is None else payloads[i]
        payload_bytes = memoryview(payload).nbytes
        digest = xxhash.xxh3_128() if mac_secret is None else blake3.blake3()
        digest.update(tokens)
        digest.update(payload)
        members.append(
            {
                "scope": key.scope,
                "token_count": key.token_count,
                "prefix_hash": key.prefix_hash,
                "state_bytes": state.nbytes,
                "payload_bytes": payload_bytes,
                "digest": digest.hexdigest(),
            }
        )
        body += [tokens, payload]
        bodies.append(tokens.nbytes + payload_bytes)
        state_sizes.append(state.nbytes)
    header = {
        "store_id": store_id,
        "model_fingerprint": fingerprint,
        "priority": first.priority,
        "created_at": first.created_at,
        "codec": state_codec.header(),
        "digest": "xxh3_128" if mac_secret is None else "blake3",
        "members": members,
    }
    head = PACK.head(PACK_VERSION, header, mac_secret, too_large=PackTooLarge)
    head_bytes = len(head)
    return EncodedPack(
        parts=(head, *body),
        size=head_bytes + sum(bodies),
        shares=member_shares(head_bytes, bodies),
        state_bytes=tuple(state_sizes),
    )


def member_shares(head_bytes: int, bodies: list[int]) -> tuple[int, ...]:
    """Each member's bytes plus an even part of the head (the first ones take the remainder)."""
    part, extra = divmod(head_bytes, len(bodies))
    return tuple(size + part + (1 if i < extra else 0) for i, size in enumerate(bodies))


def read_pack_head(file: BinaryIO, file_bytes: int, *, mac_secret: bytes | None) -> PackHead:
    """Read and check the head of an open pack file of `file_bytes` bytes (its payloads unread).

    A MAC that does not verify is reported in `authenticated`, not raised; everything else raises
    CorruptSnapshot.
    """
    return _pack_head(PACK.read(file, mac_secret), file_bytes)


def parse_pack_head(data: Buffer, file_bytes: int, *, mac_secret: bytes | None) -> PackHead:
    """Check the head at the start of `data` (the head at least) of a pack of `file_bytes` bytes."""
    return _pack_head(PACK.check(data, mac_secret), file_bytes)


def _pack_head(checked: CheckedHead, file_bytes: int) -> PackHead:
    """The members a checked head lists, checked against each other and against `file_bytes`."""
    header = checked.header
    has_mac = checked.has_mac
    state_codec = StateCodec.of_header(PACK.field(header, "codec", dict))
    if PACK.field(header, "digest", str) != ("blake3" if has_mac else "xxh3_128"):
        raise CorruptSnapshot("pack names the wrong member digest")
    priority, created_at = checked_time_and_priority(header)
    store_id: str = PACK.field(header, "store_id", str)
    fingerprint: str = PACK.field(header, "model_fingerprint", str)
    listed = PACK.field(header, "members", list)
    if not 0 < len(listed) <= MAX_MEMBERS:
        raise CorruptSnapshot(f"a pack lists 1 to {MAX_MEMBERS} members, not {len(listed)}")
    members: list[PackMember] = []
    body_start = checked.body_start
    offset = body_start
    for fields in listed:
        if not isinstance(fields, dict):
            raise CorruptSnapshot("a pack member is not a JSON object")
        token_count = PACK.bounded(fields, "token_count", MAX_TOKENS)
        try:
            key = SnapshotKey(
                fingerprint,
                PACK.field(fields, "scope", str),
                token_count,
                PACK.field(fields, "prefix_hash", str),
            )
        except ValueError as exc:
            raise CorruptSnapshot(f"a pack member's key is invalid: {exc}") from None
        size = 4 * token_count + PACK.bounded(fields, "payload_bytes", MAX_STATE_BYTES)
        digest = PACK.digest_field(fields, "digest", 32 if has_mac else 16)
        state_bytes = PACK.bounded(fields, "state_bytes", MAX_STATE_BYTES)
        members.append(PackMember(key, offset, size, state_bytes, digest))
        offset += size
    by_key = {member.key: member for member in members}
    if len(by_key) != len(members):
        raise CorruptSnapshot("a pack lists one key twice")
    if offset != file_bytes:
        raise CorruptSnapshot(f"pack is {file_bytes} bytes, its header describes {offset}")
    return PackHead(
        store_id=store_id,
        priority=priority,
        created_at=created_at,
        state_codec=state_codec,
        members=tuple(members),
        file_bytes=offset,
        has_mac=has_mac,
        authenticated=checked.mac_problem is None,
        shares=member_shares(body_start, [member.size for member in members]),
        by_key=by_key,
    )


def decode_member(
    head: PackHead,
    member: PackMember,
    data: Buffer,
    *,
    state_into: memoryview | None = None,
) -> Snapshot:
    """Verify `data`, the member's bytes read from its file, and return its snapshot (copies of what it
    keeps; with `state_into`, see codec.decoded). Raises MacMismatch for a head authenticated
    otherwise, CorruptSnapshot for damage."""
    if not head.authenticated:
        raise MacMismatch("pack is authenticated under another secret (or none), or none is configured")
    view = memoryview(data).cast("B")
    if view.nbytes != member.size:
        raise CorruptSnapshot(f"pack member is {view.nbytes} bytes, its header describes {member.size}")
    digest = blake3.blake3(view).digest() if head.has_mac else xxhash.xxh3_128_digest(view)
    if not hmac.compare_digest(digest, member.digest):
        raise CorruptSnapshot("pack member checksum mismatch")
    tokens_end = 4 * member.key.token_count
    tokens = file_tokens(view[:tokens_end])
    if not member.key.matches(tokens):
        raise CorruptSnapshot("a pack block's tokens do not hash to its key")
    state = codec.decoded(head.state_codec, view[tokens_end:], member.state_bytes, state_into)
    return Snapshot(
        key=member.key,
        tokens=tokens,
        state=state,
        priority=head.priority,
        created_at=head.created_at,
    )


def read_member_tokens(file: BinaryIO, member: PackMember) -> TokenArray:
    """The tokens of `member`, read from its open pack file and checked against its key (a
    read-only copy); CorruptSnapshot when the file ends inside them or they do not hash to it."""
    file.seek(member.offset)
    raw = read_exactly(file, 4 * member.key.token_count)
    if len(raw) != 4 * member.key.token_count:
        raise CorruptSnapshot("pack is truncated inside a block's tokens")
    tokens = file_tokens(raw)
    if not member.key.matches(tokens):
        raise CorruptSnapshot("a pack block's tokens do not hash to its key")
    return tokens
