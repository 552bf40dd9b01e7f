"""Bundles: snapshots and the blocks they need in one file, to ship with an app and import elsewhere.

`export_bundle` writes the snapshots named by their keys as stored: a record with every shared block
it names, or a whole state. `import_bundle` verifies the whole bundle (format, every checksum, the
MAC when a secret is configured, the model fingerprint and llama.cpp's state format) before it stores
anything, then stores what the store does not hold already at the same or a higher priority.
The file layout is in `formats.bundle_file`.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3
import llama_cpp

from snapcache.errors import CorruptSnapshot, InvalidArgument
from snapcache.formats import codec
from snapcache.formats.bundle_file import (
    ENTRY_STORE_ID,
    BundleError,
    BundleRefused,
    CorruptBundle,
    Kind,
    Manifest,
    ManifestEntry,
    content_digest,
    encode_head,
    read_head,
)
from snapcache.formats.snapshot_file import decode, encode, mac_key
from snapcache.key import SnapshotKey, block_keys
from snapcache.llama.state.blocks import is_record, read_record
from snapcache.snapshot import Buffer, Snapshot
from snapcache.store import SnapshotStore, resolve_secret
from snapcache.version import __version__

__all__ = [
    "BundleError",
    "BundleRefused",
    "CorruptBundle",
    "ExportReport",
    "ImportReport",
    "export_bundle",
    "import_bundle",
    "state_format_version",
]


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What `export_bundle` wrote: the snapshots asked for, and the shared blocks they need."""

    path: Path
    snapshots: tuple[SnapshotKey, ...]
    blocks: int
    state_bytes: int  # of every entry, uncompressed
    file_bytes: int
    authenticated: bool  # whether the bundle carries a MAC


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What `import_bundle` found in a bundle and did with each of its entries (snapshots and blocks)."""

    path: Path
    snapshots: tuple[SnapshotKey, ...]  # the records and whole states the bundle holds
    stored: tuple[SnapshotKey, ...]
    skipped: tuple[SnapshotKey, ...]  # held already at the same or a higher priority
    dropped: tuple[SnapshotKey, ...]  # no tier of the store kept them (see SnapshotStore.put)
    model_fingerprints: tuple[str, ...]
    authenticated: bool  # whether its MAC was verified under the importer's secret


def state_format_version() -> int:
    """The llama.cpp sequence-state format (LLAMA_STATE_SEQ_VERSION) this llama-cpp-python reads."""
    return int(getattr(llama_cpp, "LLAMA_STATE_SEQ_VERSION", 0))


def export_bundle(
    store: SnapshotStore,
    keys: Iterable[SnapshotKey],
    path: str | os.PathLike[str],
    *,
    secret: bytes | str | None = None,
) -> ExportReport:
    """Write the snapshots under `keys`, with every block they need, to a bundle at `path`.

    `secret` (default: `SNAPCACHE_SECRET`) adds a MAC that an importer with the same secret checks.
    The file appears whole or not at all. InvalidArgument for a key the store does not hold;
    BundleError for a snapshot that lacks one of its blocks (evicted since).
    """
    wanted = _distinct_snapshot_keys(keys)
    mac_secret = _mac_secret(secret)
    chosen: dict[SnapshotKey, tuple[Kind, Snapshot]] = {}
    for key in wanted:
        snapshot = store.get(key)
        if snapshot is None:
            raise InvalidArgument(f"snapshot {key.id[:12]} is not in the store (or failed verification)")
        if not is_record(snapshot.state):
            chosen[key] = ("whole", snapshot)
            continue
        try:
            record = read_record(snapshot.state)
        except ValueError as exc:
            raise BundleError(f"snapshot {key.id[:12]} holds a malformed record: {exc}") from None
        needed = block_keys(key.model_fingerprint, key.scope, snapshot.tokens, record.n_blocks)
        unread = [block_key for block_key in needed if block_key not in chosen]
        found = store.get_blocks(unread)  # up to the first missing one, read together
        for block_key, (block, _tier) in zip(unread, found, strict=False):
            chosen[block_key] = ("block", block)
        if len(found) < len(unread):
            i = needed.index(unread[len(found)])
            raise BundleError(
                f"snapshot {key.id[:12]} lacks block {i + 1} of its {record.n_blocks} "
                "(evicted or unreadable): warm it again before exporting"
            )
        chosen[key] = ("record", snapshot)

    entries: list[ManifestEntry] = []
    parts: list[Buffer] = []
    offset = 0
    for key, (kind, snapshot) in chosen.items():
        encoded = encode(
            snapshot,
            store_id=ENTRY_STORE_ID,
            state_codec=codec.ZSTD,  # a bundle travels: compressed, whatever the store does
            mac_secret=None,  # the manifest's digest and MAC cover each entry's BLAKE3
        )
        digest = blake3.blake3()
        for part in encoded.parts:
            digest.update(part)
        entries.append(
            ManifestEntry(
                key=key,
                kind=kind,
                priority=snapshot.priority,
                state_bytes=encoded.state_bytes,
                offset=offset,
                length=encoded.size,
                file_blake3=digest.hexdigest(),
                content_blake3=content_digest(snapshot),
            )
        )
        parts.extend(encoded.parts)
        offset += encoded.size

    manifest = Manifest(
        snapcache_version=__version__,
        state_seq_version=state_format_version(),
        model_fingerprints=tuple(sorted({key.model_fingerprint for key in chosen})),
        created_at=time.time(),
        entries=tuple(entries),
    )
    target = Path(path)
    file_bytes = _write_atomically(target, [encode_head(manifest, mac_secret), *parts])
    return ExportReport(
        path=target,
        snapshots=tuple(wanted),
        blocks=sum(1 for entry in entries if entry.kind == "block"),
        state_bytes=sum(entry.state_bytes for entry in entries),
        file_bytes=file_bytes,
        authenticated=mac_secret is not None,
    )


def import_bundle(
    store: SnapshotStore,
    path: str | os.PathLike[str],
    *,
    fingerprint: str | None = None,
    secret: bytes | str | None = None,
) -> ImportReport:
    """Verify the bundle at `path` whole, then store its entries; nothing is stored if any check fails.

    `fingerprint`: the model fingerprint the importer restores into (`model_fingerprint(llm)`); a
    bundle with entries of another is refused. `secret` (default: `SNAPCACHE_SECRET`; give the
    store's): when set, a bundle without a MAC made under it is refused. A bundle of another
    llama.cpp state format is refused too (BundleRefused); a damaged one is CorruptBundle. Entries
    the store holds already at the same or a higher priority are skipped. The bundle's states are
    held in memory until stored.
    """
    source = Path(path)
    mac_secret = _mac_secret(secret)
    with open(source, "rb") as file:
        file_bytes = os.fstat(file.fileno()).st_size
        try:
            head = read_head(file, file_bytes, mac_secret)
        except BundleError as exc:
            raise type(exc)(f"bundle {source.name}: {exc}") from None
        manifest = head.manifest
        _check_compatible(manifest, fingerprint, source.name)
        snapshots = [_read_entry(file, entry, source.name) for entry in manifest.entries]
    _check_records_complete(snapshots, source.name)

    stored: list[SnapshotKey] = []
    skipped: list[SnapshotKey] = []
    dropped: list[SnapshotKey] = []
    # Blocks first: a record stored before its blocks would be a miss for a concurrent lookup.
    for _kind, snapshot in sorted(snapshots, key=lambda pair: pair[0] != "block"):
        key = snapshot.key
        held = store.held_priority(key)
        if held is not None and held >= snapshot.priority:
            skipped.append(key)
            continue
        if store.put(key, snapshot.tokens, snapshot.state, snapshot.priority, snapshot.logits) is None:
            dropped.append(key)
        else:
            stored.append(key)
    store.flush()
    # A background write the disk refused is dropped only then.
    lost = [key for key in stored if store.held_priority(key) is None]
    return ImportReport(
        path=source,
        snapshots=tuple(entry.key for entry in manifest.entries if entry.kind != "block"),
        stored=tuple(key for key in stored if key not in lost),
        skipped=tuple(skipped),
        dropped=tuple(dropped + lost),
        model_fingerprints=manifest.model_fingerprints,
        authenticated=head.authenticated,
    )


def _check_compatible(manifest: Manifest, fingerprint: str | None, name: str) -> None:
    here = state_format_version()
    if manifest.state_seq_version != here:
        raise BundleRefused(
            f"bundle {name} holds llama.cpp state format {manifest.state_seq_version}, "
            f"this llama-cpp-python reads format {here}"
        )
    if fingerprint is not None:
        other = [f for f in manifest.model_fingerprints if f != fingerprint]
        if other:
            raise BundleRefused(
                f"bundle {name} is for another model (fingerprint {other[0][:12]}), "
                f"not this one ({fingerprint[:12]})"
            )


def _read_entry(file: BinaryIO, entry: ManifestEntry, name: str) -> tuple[Kind, Snapshot]:
    """The entry at the file's current position, verified against the manifest."""
    data = file.read(entry.length)
    where = f"bundle {name}: entry {entry.key.id[:12]}"
    if len(data) != entry.length:
        raise CorruptBundle(f"{where} is truncated")
    if not hmac.compare_digest(blake3.blake3(data).hexdigest(), entry.file_blake3):
        raise CorruptBundle(f"{where} checksum mismatch (BLAKE3)")
    try:
        snapshot = decode(
            data, key=entry.key, store_id=ENTRY_STORE_ID, mac_secret=None, max_state_bytes=entry.state_bytes
        )
    except CorruptSnapshot as exc:
        raise CorruptBundle(f"{where}: {exc}") from None
    if memoryview(snapshot.state).nbytes != entry.state_bytes or snapshot.priority != entry.priority:
        raise CorruptBundle(f"{where} differs from its manifest row")
    if content_digest(snapshot) != entry.content_blake3:
        raise CorruptBundle(f"{where} content checksum mismatch (BLAKE3)")
    if entry.kind == "record":
        try:
            read_record(snapshot.state)
        except ValueError as exc:
            raise CorruptBundle(f"{where} holds a malformed record: {exc}") from None
    elif entry.kind == "whole" and is_record(snapshot.state):
        raise CorruptBundle(f"{where} is a record, its manifest says a whole state")
    return entry.kind, snapshot


def _check_records_complete(snapshots: list[tuple[Kind, Snapshot]], name: str) -> None:
    """CorruptBundle unless every record comes with every block it names."""
    blocks = {snapshot.key for kind, snapshot in snapshots if kind == "block"}
    for kind, snapshot in snapshots:
        if kind != "record":
            continue
        key = snapshot.key
        n_blocks = read_record(snapshot.state).n_blocks
        if not set(block_keys(key.model_fingerprint, key.scope, snapshot.tokens, n_blocks)) <= blocks:
            raise CorruptBundle(f"bundle {name}: snapshot {key.id[:12]} comes without all its blocks")


def _distinct_snapshot_keys(keys: Iterable[SnapshotKey]) -> list[SnapshotKey]:
    wanted: list[SnapshotKey] = []
    for key in keys:
        if not isinstance(key, SnapshotKey):
            raise InvalidArgument(f"keys must be SnapshotKeys, got {type(key).__name__}")
        if key.is_block:
            raise InvalidArgument("a bundle names snapshots; their blocks come with them")
        if key not in wanted:
            wanted.append(key)
    if not wanted:
        raise InvalidArgument("no snapshot keys to export")
    return wanted


def _mac_secret(secret: bytes | str | None) -> bytes | None:
    resolved = resolve_secret(secret)
    return None if resolved is None else mac_key(resolved)


def _write_atomically(target: Path, parts: list[Buffer]) -> int:
    """Write `parts` to a temporary file beside `target`, then rename it over `target`.

    The file is readable by its owner only, like the cache directory: its tokens spell the prompts."""
    directory = target.parent
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "wb") as file:
            for part in parts:
                file.write(part)
            file.flush()
            os.fsync(file.fileno())
            size = file.tell()
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename reaches the disk too (not on every platform)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return size
