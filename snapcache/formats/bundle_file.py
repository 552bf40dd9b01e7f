"""The bundle file: a checked manifest, then one snapshot file per entry.

Layout (all integers little-endian)::

    envelope  prelude (magic "\\x89SNAPB\\r\\n", format version 1), the manifest (JSON, at most
              MAX_MANIFEST_BYTES), SHA-256, MAC (see formats.envelope)
    entries   each entry a snapshot file as the disk tier writes it (see formats.snapshot_file), back to back

The manifest names every entry (its key, kind, priority, sizes) with the BLAKE3 of its bytes in the
bundle and the BLAKE3 of its content (tokens, logits and state). The digest, and with a secret the
MAC, of the manifest thus covers every byte of the bundle, and each entry is checked against its
digest before it is decompressed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, cast

import blake3
import numpy as np

from snapcache.errors import InvalidArgument, SnapcacheError
from snapcache.formats.envelope import Envelope
from snapcache.key import SnapshotKey, validate_priority
from snapcache.snapshot import Snapshot

MAGIC = b"\x89SNAPB\r\n"
FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20
MAX_ENTRY_BYTES = 1 << 38
# Every entry is stored under this store id: a bundle belongs to no store.
ENTRY_STORE_ID = "bundle"

Kind = Literal["record", "block", "whole"]
KINDS: tuple[Kind, ...] = ("record", "block", "whole")


class BundleError(SnapcacheError, ValueError):
    """A bundle cannot be written or read: damaged, malformed, or refused."""


class CorruptBundle(BundleError):
    """A bundle failed its format, length or checksum checks."""


class BundleRefused(BundleError):
    """An intact bundle this side will not import: another model or state format, or no valid MAC."""


BUNDLE = Envelope(
    MAGIC, (FORMAT_VERSION,), MAX_MANIFEST_BYTES, "bundle", damaged=CorruptBundle, header_name="manifest"
)


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One entry of a bundle: the snapshot file at `offset` (from the first entry), `length` bytes."""

    key: SnapshotKey
    kind: Kind
    priority: int
    state_bytes: int
    offset: int
    length: int
    file_blake3: str  # of the entry's bytes in the bundle
    content_blake3: str  # of its tokens, logits and state (see content_digest)


@dataclass(frozen=True, slots=True)
class Manifest:
    """What the head of a bundle says about it."""

    snapcache_version: str
    state_seq_version: int
    model_fingerprints: tuple[str, ...]
    created_at: float
    entries: tuple[ManifestEntry, ...]

    @property
    def payload_bytes(self) -> int:
        return sum(entry.length for entry in self.entries)


@dataclass(frozen=True, slots=True)
class Head:
    """A checked head: the manifest, where the entries start, and whether its MAC was verified."""

    manifest: Manifest
    entries_start: int
    has_mac: bool
    authenticated: bool


def content_digest(snapshot: Snapshot) -> str:
    """BLAKE3 of a snapshot's tokens (int32), logits (float32) and state, in hex."""
    digest = blake3.blake3(np.ascontiguousarray(snapshot.tokens, dtype="<i4").tobytes())
    if snapshot.logits is not None:
        digest.update(np.ascontiguousarray(snapshot.logits, dtype="<f4").tobytes())
    digest.update(memoryview(snapshot.state).cast("B"))
    return digest.hexdigest()


def encode_head(manifest: Manifest, mac_secret: bytes | None) -> bytes:
    """The prelude, manifest, digest and (with `mac_secret`, from mac_key()) MAC of a bundle."""
    body = {
        "bundle_format": FORMAT_VERSION,
        "snapcache_version": manifest.snapcache_version,
        "llama_state_seq_version": manifest.state_seq_version,
        "model_fingerprints": list(manifest.model_fingerprints),
        "created_at": manifest.created_at,
        "entries": [_entry_json(entry) for entry in manifest.entries],
    }
    return BUNDLE.head(FORMAT_VERSION, body, mac_secret, too_large=BundleError)


def read_head(file: BinaryIO, file_bytes: int, mac_secret: bytes | None) -> Head:
    """Check the prelude, the manifest's digest, its MAC and its fields, and the bundle's length.

    With `mac_secret`, a bundle without a MAC or with one made under another secret is refused
    (BundleRefused); without, a MAC is not checked (`authenticated` is False). Damage is
    CorruptBundle.
    """
    # Without a secret a MAC is not checked: the bundle is read, but not `authenticated`.
    checked = BUNDLE.read(file, mac_secret, refuse=None if mac_secret is None else BundleRefused)
    entries_start = checked.body_start
    manifest = _parse_manifest(checked.header)
    described = entries_start + manifest.payload_bytes
    if file_bytes != described:
        what = "truncated" if file_bytes < described else "longer than its manifest describes"
        raise CorruptBundle(f"{what}: {file_bytes} bytes, its manifest describes {described}")
    authenticated = checked.has_mac and mac_secret is not None
    return Head(manifest, entries_start, checked.has_mac, authenticated=authenticated)


def _entry_json(entry: ManifestEntry) -> dict[str, Any]:
    key = entry.key
    return {
        "kind": entry.kind,
        "model_fingerprint": key.model_fingerprint,
        "scope": key.scope,
        "token_count": key.token_count,
        "prefix_hash": key.prefix_hash,
        "priority": entry.priority,
        "state_bytes": entry.state_bytes,
        "offset": entry.offset,
        "length": entry.length,
        "file_blake3": entry.file_blake3,
        "content_blake3": entry.content_blake3,
    }


def _parse_manifest(body: dict[str, Any]) -> Manifest:
    if BUNDLE.field(body, "bundle_format", int) != FORMAT_VERSION:
        raise CorruptBundle("the manifest's format version differs from its prelude's")
    fingerprints = BUNDLE.field(body, "model_fingerprints", list)
    if not all(isinstance(f, str) for f in fingerprints):
        raise CorruptBundle("malformed manifest: model_fingerprints")
    rows = BUNDLE.field(body, "entries", list)
    entries: list[ManifestEntry] = []
    offset = 0
    for row in rows:
        if not isinstance(row, dict):
            raise CorruptBundle("malformed manifest: an entry is not an object")
        entry = _parse_entry(row)
        if entry.offset != offset:
            raise CorruptBundle("malformed manifest: entries do not follow one another")
        offset += entry.length
        entries.append(entry)
    if {e.key.model_fingerprint for e in entries} != set(fingerprints):
        raise CorruptBundle("malformed manifest: its model fingerprints differ from its entries'")
    if len({e.key for e in entries}) != len(entries):
        raise CorruptBundle("malformed manifest: an entry appears twice")
    created_at = BUNDLE.field(body, "created_at", float, int)
    return Manifest(
        snapcache_version=BUNDLE.field(body, "snapcache_version", str),
        state_seq_version=BUNDLE.field(body, "llama_state_seq_version", int),
        model_fingerprints=tuple(fingerprints),
        created_at=float(created_at),
        entries=tuple(entries),
    )


def _parse_entry(row: dict[str, Any]) -> ManifestEntry:
    try:
        key = SnapshotKey(
            BUNDLE.field(row, "model_fingerprint", str),
            BUNDLE.field(row, "scope", str),
            BUNDLE.field(row, "token_count", int),
            BUNDLE.field(row, "prefix_hash", str),
        )
        priority = validate_priority(BUNDLE.field(row, "priority", int))
    except InvalidArgument as exc:
        raise CorruptBundle(f"malformed manifest entry: {exc}") from None
    kind = BUNDLE.field(row, "kind", str)
    if kind not in KINDS or (kind == "block") != key.is_block:
        raise CorruptBundle(f"malformed manifest entry: kind {kind!r}")
    sizes = [BUNDLE.field(row, name, int) for name in ("state_bytes", "offset", "length")]
    if any(size < 0 or size > MAX_ENTRY_BYTES for size in sizes):
        raise CorruptBundle("malformed manifest entry: a size out of range")
    digests = [BUNDLE.field(row, name, str) for name in ("file_blake3", "content_blake3")]
    if not all(len(d) == 64 and all(c in "0123456789abcdef" for c in d) for d in digests):
        raise CorruptBundle("malformed manifest entry: a digest")
    return ManifestEntry(
        key=key,
        kind=cast(Kind, kind),  # checked against KINDS above
        priority=priority,
        state_bytes=sizes[0],
        offset=sizes[1],
        length=sizes[2],
        file_blake3=digests[0],
        content_blake3=digests[1],
    )
