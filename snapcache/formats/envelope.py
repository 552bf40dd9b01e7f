"""The checked envelope every snapcache file starts with: snapshot files, pack files and bundles.

Layout (all integers little-endian)::

    prelude   magic (8) | format version (u16) | flags (u16) | header length (u32)
    header    UTF-8 JSON object, at most the format's limit
    digest    SHA-256 of prelude + header
    mac       HMAC-SHA256 of prelude + header under the secret (only with FLAG_MAC)

An `Envelope` is one format's magic, versions, header limit and error type; it writes a head and
reads one back: the prelude checked, then the digest, then the MAC, then the header parsed. Each
format's header names what the rest of its file must hash to, so the digest (or MAC) of the head
covers the whole file. A MAC that does not verify over an intact head is not damage but another
configuration: the check reports it (`CheckedHead.mac_problem`), or raises the caller's `refuse` type.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

from snapcache.errors import CorruptSnapshot, SnapcacheError
from snapcache.snapshot import Buffer

PRELUDE = struct.Struct("<8sHHI")
DIGEST_BYTES = 32
FLAG_MAC = 1
_KNOWN_FLAGS = FLAG_MAC
_MAC_PERSON = b"snapcache.mac1"


class MacMismatch(CorruptSnapshot):
    """An intact file authenticated under another secret (or none, or without one when one is set).

    Not damage: another process, configured otherwise, may share the directory and read it.
    """


def mac_key(secret: bytes) -> bytes:
    """The HMAC key derived from a user secret of any length."""
    return hashlib.blake2b(secret, digest_size=32, person=_MAC_PERSON).digest()


@dataclass(frozen=True, slots=True)
class CheckedHead:
    """A head whose prelude and digest checked out; `header` is its parsed JSON object."""

    version: int
    has_mac: bool
    header: dict[str, Any]
    body_start: int  # where the head ends: the first byte after its digest (and MAC)
    mac_problem: str | None  # why the MAC does not verify under the secret given; None when it does


@dataclass(frozen=True, slots=True)
class Envelope:
    """One format's envelope: what its prelude must say, and the error its damage raises."""

    magic: bytes
    versions: tuple[int, ...]
    max_header_bytes: int
    kind: str  # how messages name the format: "snapshot", "pack", "bundle"
    damaged: type[SnapcacheError] = CorruptSnapshot
    header_name: str = "header"  # how messages name the header ("manifest" in a bundle)

    def head(
        self,
        version: int,
        header: dict[str, Any],
        mac_secret: bytes | None,
        *,
        too_large: type[Exception] = ValueError,
    ) -> bytes:
        """The prelude, `header` as compact JSON, their SHA-256 and, with a secret (from mac_key),
        their HMAC; `too_large` raised when the header would exceed the format's limit."""
        text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
        if len(text) > self.max_header_bytes:
            raise too_large(f"the {self.kind} {self.header_name} would exceed {self.max_header_bytes} bytes")
        flags = FLAG_MAC if mac_secret is not None else 0
        head = PRELUDE.pack(self.magic, version, flags, len(text)) + text
        checks = hashlib.sha256(head).digest()
        if mac_secret is not None:
            checks += hmac.digest(mac_secret, head, "sha256")
        return head + checks

    def header_length(self, prelude: Buffer) -> int:
        """The header length a prelude states, once its magic, version, flags and that length check
        out; the format's damage error otherwise."""
        view = memoryview(prelude).cast("B")
        if view.nbytes < PRELUDE.size:
            raise self.damaged(f"{self.kind} file is shorter than its prelude")
        magic, version, flags, header_len = PRELUDE.unpack_from(view)
        if magic != self.magic:
            raise self.damaged(f"not a snapcache {self.kind} file (bad magic)")
        if version not in self.versions:
            readable = ", ".join(str(v) for v in self.versions)
            raise self.damaged(
                f"unsupported {self.kind} format version {version} (this snapcache reads {readable})"
            )
        if flags & ~_KNOWN_FLAGS:
            raise self.damaged(f"unknown {self.kind} file flags {flags:#x}")
        if header_len > self.max_header_bytes:
            raise self.damaged(f"{self.header_name} length {header_len} exceeds {self.max_header_bytes}")
        return int(header_len)

    def check(
        self, data: Buffer, mac_secret: bytes | None, *, refuse: type[Exception] | None = None
    ) -> CheckedHead:
        """Check the head at the start of `data` (the head at least): prelude, digest, MAC, header.

        A MAC that does not verify (or is missing, or present without a secret) raises `refuse`
        with the reason when given; otherwise it is reported in `mac_problem`. Damage raises the
        format's error.
        """
        view = memoryview(data).cast("B")
        header_len = self.header_length(view[: PRELUDE.size])
        _magic, version, flags, _length = PRELUDE.unpack_from(view)
        has_mac = bool(flags & FLAG_MAC)
        head_end = PRELUDE.size + header_len
        body_start = head_end + DIGEST_BYTES * (2 if has_mac else 1)
        if view.nbytes < body_start:
            raise self.damaged(f"{self.kind} file is truncated inside its {self.header_name}")
        head = view[:head_end]
        if not hmac.compare_digest(hashlib.sha256(head).digest(), view[head_end : head_end + DIGEST_BYTES]):
            raise self.damaged(f"{self.kind} {self.header_name} checksum mismatch")
        # The head is intact from here on: a failing MAC means another configuration, not damage.
        mac_problem = self._mac_problem(head, view[head_end + DIGEST_BYTES : body_start], has_mac, mac_secret)
        if mac_problem is not None and refuse is not None:
            raise refuse(mac_problem)
        return CheckedHead(
            version=int(version),
            has_mac=has_mac,
            header=self._parse(view[PRELUDE.size : head_end]),
            body_start=body_start,
            mac_problem=mac_problem,
        )

    def read(
        self, file: BinaryIO, mac_secret: bytes | None, *, refuse: type[Exception] | None = None
    ) -> CheckedHead:
        """Read the head of an open file from where it stands, and check it (see `check`)."""
        prelude = read_exactly(file, PRELUDE.size)
        header_len = self.header_length(prelude)
        has_mac = bool(PRELUDE.unpack(prelude)[2] & FLAG_MAC)
        rest = read_exactly(file, header_len + DIGEST_BYTES * (2 if has_mac else 1))
        return self.check(prelude + rest, mac_secret, refuse=refuse)

    def _mac_problem(
        self, head: memoryview, mac: memoryview, has_mac: bool, mac_secret: bytes | None
    ) -> str | None:
        if mac_secret is None:
            if has_mac:
                return f"{self.kind} file is authenticated with a secret, and none is configured"
            return None
        if not has_mac:
            return f"{self.kind} file carries no MAC, and a secret is configured"
        if not hmac.compare_digest(hmac.digest(mac_secret, head, "sha256"), mac):
            return f"{self.kind} file MAC mismatch: written under another secret or tampered with"
        return None

    def _parse(self, raw: memoryview) -> dict[str, Any]:
        try:
            header = json.loads(bytes(raw).decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise self.damaged(f"{self.header_name} is not valid JSON: {exc}") from None
        if not isinstance(header, dict):
            raise self.damaged(f"{self.header_name} is not a JSON object")
        return header

    def field(self, mapping: dict[str, Any], name: str, *kinds: type) -> Any:
        """`mapping[name]` when it is one of `kinds` (never a bool); the format's error otherwise."""
        value = mapping.get(name)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise self.damaged(f"{self.header_name} field {name!r} is missing or malformed")
        return value

    def bounded(self, mapping: dict[str, Any], name: str, limit: int) -> int:
        """An integer field in 0..`limit`."""
        value: int = self.field(mapping, name, int)
        if not 0 <= value <= limit:
            raise self.damaged(f"{self.header_name} field {name!r} = {value} is outside 0..{limit}")
        return value

    def digest_field(self, mapping: dict[str, Any], name: str, size: int) -> bytes:
        """A field holding a `size`-byte digest in hex, as bytes."""
        text: str = self.field(mapping, name, str)
        try:
            digest = bytes.fromhex(text)
        except ValueError:
            digest = b""
        if len(digest) != size:
            raise self.damaged(f"{self.header_name} field {name!r} is not a {size}-byte digest")
        return digest


def read_exactly(file: BinaryIO, size: int) -> bytes:
    """`size` bytes of `file` from where it stands, fewer only where it ends: a read of an unbuffered
    file (a pack opened for many reads) may return fewer before then, on a network filesystem."""
    pieces = []
    while size > 0:
        piece = file.read(size)
        if not piece:
            break
        pieces.append(piece)
        size -= len(piece)
    return b"".join(pieces)
