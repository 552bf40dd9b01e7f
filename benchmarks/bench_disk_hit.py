"""A disk hit end to end, format 1 (zstd + numpy shuffle) against format 2 (blosc2, XXH3 / BLAKE3).

    python benchmarks/bench_disk_hit.py [--quick] [--repeat 15] [--runs 5] [--json PATH]

A hit is what DiskTier.get does with a snapshot file: read it whole, verify its header, its tokens and
logits and its payload, and decompress the state into the one buffer that is handed to llama.cpp.
States are real Gemma-3-270M states (f16 KV) of a 1,200-token prompt and of a 9,344-token one (35
MiB, captured once by a 2-3 minute prefill and kept with bench_codec.py's states). The file is read
from the page cache: a cold disk adds its own read time. A table goes through a real DiskTier (its
index lookup and bookkeeping included); another shows a new process's first hit, whose buffers are
fresh pages and which may wait for blosc2's import. The next restores the states from shared blocks,
in a store opened afresh (the sliding window bare, and in turn padded as CachedLlama restores it),
in new processes (with the memory they then hold), and in processes allowed one core and two, in
turn (what the second core adds). A last table sets the blocks' copy from the store's pack files
beside the same blocks in a file each (the layout before packs) and their payloads alone in one
file (what is left without an index and headers).
--quick uses the test suite's tiny model.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_codec
import numpy as np
import xxhash
from _common import Table, make_parser, report

from snapcache.disk.disk_tier import DiskTier
from snapcache.disk.files import FILES_DIR, decode_buffer, read_file  # the disk tier's own
from snapcache.formats import codec, snapshot_file
from snapcache.formats.codec import ZSTD
from snapcache.formats.threads import map_in_parallel
from snapcache.key import BLOCK_TOKENS, SnapshotKey, TokenArray, block_keys
from snapcache.llama.state._state_layout import pad_window, parse_sections
from snapcache.llama.state.assembly import Assembly
from snapcache.llama.state.blocks import KIND_PREFIX, SplitState, split_state
from snapcache.llama.state.sequences import CapturedState
from snapcache.llama.stored.stored_states import RestorePoint, StoredStates
from snapcache.snapshot import Snapshot
from snapcache.store import SnapshotStore

STORE_ID = "bench"
SECRET = b"bench-secret"
LONG_TOKENS = 9344
GEMMA_VOCABULARY = 262_144  # one row of logits is stored with each snapshot


def encode_format_2(snapshot: Snapshot, mac_secret: bytes | None) -> snapshot_file.EncodedFile:
    return snapshot_file.encode(snapshot, store_id=STORE_ID, state_codec=ZSTD, mac_secret=mac_secret)


def encode_format_1(snapshot: Snapshot, mac_secret: bytes | None) -> bytes:
    """The file snapcache 0.1.0 wrote: format 2's head with format 1's codec and digests."""
    parts = encode_format_2(snapshot, mac_secret).parts
    prelude = snapshot_file.PRELUDE
    _, _, flags, length = prelude.unpack_from(parts[0])
    header = json.loads(bytes(parts[0][prelude.size : prelude.size + length]))
    payload = codec.compress_zstd_frame(snapshot.state, level=1, shuffle=True)
    header["codec"] = {"name": "zstd", "level": 1, "shuffle": 2}
    header["payload_bytes"] = len(payload)
    header["payload_checksum"] = payload[-4:].hex()
    header.pop("payload_xxh3", None)
    if header.pop("payload_blake3", None) is not None:
        header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    raw = json.dumps(header, separators=(",", ":")).encode()
    head = prelude.pack(snapshot_file.MAGIC, 1, flags, len(raw)) + raw
    checks = hashlib.sha256(head).digest()
    if mac_secret is not None:
        checks += hmac.digest(mac_secret, head, "sha256")
    return head + checks + b"".join(bytes(p) for p in parts[1:3]) + payload


def snapshot_of(state: bytes, n_tokens: int, n_logits: int) -> Snapshot:
    tokens = np.arange(1, n_tokens + 1, dtype=np.int32)
    logits = np.linspace(-8, 8, n_logits, dtype=np.float32)
    return Snapshot(SnapshotKey.for_tokens("bench", "default", tokens), tokens, state, logits=logits)


def hit_row(
    table: Table, name: str, snapshot: Snapshot, version: int, secret: bytes | None, repeat: int
) -> dict[str, Any]:
    mac_secret = None if secret is None else snapshot_file.mac_key(secret)
    if version == 1:
        data = encode_format_1(snapshot, mac_secret)
    else:
        encoded = snapshot_file.encode(snapshot, store_id=STORE_ID, state_codec=ZSTD, mac_secret=mac_secret)
        data = b"".join(bytes(p) for p in encoded.parts)
    state_bytes = len(snapshot.state)
    reads, decodes, totals, cpus = [], [], [], []
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "snapshot.snap"
        path.write_bytes(data)
        for _ in range(repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            view = read_file(path)
            read = time.perf_counter()
            got = snapshot_file.decode(view, key=snapshot.key, store_id=STORE_ID, mac_secret=mac_secret)
            end = time.perf_counter()
            cpus.append(time.process_time() - start_cpu)  # every thread of the process
            reads.append(read - start)
            decodes.append(end - read)
            totals.append(end - start)
            del view
    assert bytes(got.state) == bytes(snapshot.state)
    median = statistics.median(totals)
    row = {
        "state": name,
        "state_mib": round(state_bytes / 2**20, 1),
        "format": version,
        "mac": secret is not None,
        "file_mib": round(len(data) / 2**20, 1),
        "read_ms": round(statistics.median(reads) * 1e3, 1),
        "verify_decode_ms": round(statistics.median(decodes) * 1e3, 1),
        "hit_ms": round(median * 1e3, 1),
        "hit_ms_best": round(min(totals) * 1e3, 1),
        "cpu_ms": round(statistics.median(cpus) * 1e3, 1),
        "state_gb_s": round(state_bytes / median / 1e9, 2),
        "state_gb_per_cpu_s": round(state_bytes / statistics.median(cpus) / 1e9, 2),
    }
    table.add(*row.values())
    return row


_FIRST_HIT = """
import json, sys, time
started = time.perf_counter()
import numpy as np
from snapcache.formats import snapshot_file  # numpy, zstandard, xxhash, blake3; blosc2 on a thread
from snapcache.key import SnapshotKey
imported = time.perf_counter()
path, key, store_id, wait, model = json.loads(sys.argv[1])
if model:  # what a new process does before its first hit; blosc2's import goes on meanwhile
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, verbose=False)
loaded = time.perf_counter()
if wait:
    import blosc2
waited = time.perf_counter()
with open(path, "rb", buffering=0) as file:  # as read_file() does
    view = np.empty(int(sys.argv[2]), dtype=np.uint8).data
    assert file.readinto(view) == view.nbytes
snapshot = snapshot_file.decode(view, key=SnapshotKey(*key), store_id=store_id, mac_secret=None)
done = time.perf_counter()
print(json.dumps([imported - started, waited - loaded, done - waited, len(snapshot.state)]))
"""


def first_hit_rows(table: Table, name: str, snapshot: Snapshot, runs: int, model: Path | None) -> None:
    """A new process's first hit: read + verify + decompress into freshly mapped memory."""
    key = snapshot.key
    fields = [key.model_fingerprint, key.scope, key.token_count, key.prefix_hash]
    cases: list[tuple[int, str, Path | None]] = [(1, "waited for", None), (2, "under way", None)]
    cases += [(2, "waited for", None)] + ([(2, "behind model load", model)] if model else [])
    with tempfile.TemporaryDirectory() as directory:
        for version, how, model_path in cases:
            wait = how != "under way"
            path = Path(directory) / f"format-{version}.snap"
            if version == 1:
                path.write_bytes(encode_format_1(snapshot, None))
            else:
                path.write_bytes(b"".join(bytes(p) for p in encode_format_2(snapshot, None).parts))
            argument = json.dumps([str(path), fields, STORE_ID, wait, model_path and str(model_path)])
            samples = []
            for _ in range(runs):
                out = subprocess.run(
                    [sys.executable, "-c", _FIRST_HIT, argument, str(path.stat().st_size)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                samples.append(json.loads(out.stdout))
            imported, waited, hit, state_bytes = (statistics.median(c) for c in zip(*samples, strict=True))
            table.add(
                name,
                version,
                how,
                round(imported * 1e3, 1),
                round(waited * 1e3, 1) if wait else "",
                round(hit * 1e3, 1),
                round(state_bytes / hit / 1e9, 2),
            )


def tier_row(table: Table, name: str, snapshot: Snapshot, secret: bytes | None, repeat: int) -> None:
    """put and get through a real DiskTier (format 2): the index lookup and its bookkeeping included."""
    with tempfile.TemporaryDirectory() as directory:
        tier = DiskTier(Path(directory) / "c", 1 << 34, secret=secret)
        puts = []
        for _ in range(3):
            start = time.perf_counter()
            tier.put(snapshot)
            puts.append(time.perf_counter() - start)
        gets = []
        for _ in range(repeat):
            start = time.perf_counter()
            got = tier.get(snapshot.key)
            gets.append(time.perf_counter() - start)
            assert got is not None
        assert bytes(got.state) == bytes(snapshot.state)
        tier.close()
    median = statistics.median(gets)
    table.add(
        name,
        secret is not None,
        round(statistics.median(puts) * 1e3, 1),
        round(median * 1e3, 1),
        round(min(gets) * 1e3, 1),
        round(len(snapshot.state) / median / 1e9, 2),
    )


_FIRST_FIND = """
import json, os, sys, time
import numpy as np
from pathlib import Path
from snapcache.llama.stored.stored_states import StoredStates
from snapcache.store import SnapshotStore
import blosc2  # its import, under way on a thread, is not what this measures

def resident() -> int:  # Linux: resident pages, from /proc
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return -1

path, n, secret, blocks_alone = json.loads(sys.argv[1])
tokens = np.arange(1, n + 1, dtype=np.int32)  # as snapshot_of() made them
secret = None if secret is None else secret.encode()
with SnapshotStore(Path(path), ram_bytes=256 << 20, disk_bytes=1 << 34, secret=secret) as store:
    states = StoredStates(store, "bench")
    before = resident()
    start = time.perf_counter()
    found = states.find(tokens, "default", blocks_alone=blocks_alone)
    took = time.perf_counter() - start
    after = resident()
    assert found is not None and found.snapshot.key.token_count == n
print(json.dumps([took, after - before if min(before, after) >= 0 else -1]))
"""


def first_find(path: Path, n: int, secret: bytes | None, blocks_alone: bool, runs: int) -> tuple[float, int]:
    """A new process's first restore from the blocks in `path` (a RAM tier of 256 MiB, as a server
    would have): its median time, and how much more memory the process holds once it has the
    restored blob (-1 where /proc cannot tell)."""
    argument = json.dumps([str(path), n, None if secret is None else secret.decode(), blocks_alone])
    samples = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_FIND, argument], capture_output=True, text=True, check=True
        )
        samples.append(json.loads(out.stdout))
    took, grew = (statistics.median(column) for column in zip(*samples, strict=True))
    return took, int(grew)


def save_blocks(path: Path, snapshot: Snapshot, split: SplitState, secret: bytes | None) -> TokenArray:
    """Store `snapshot` in a new store at `path` as a restore would find it: its blocks and one record
    at the end of its capture (a windowed state cannot be cut earlier); return the tokens saved."""
    tokens = snapshot.tokens[: split.n_cells if split.windows else len(snapshot.tokens)]
    captured = CapturedState(tokens, memoryview(snapshot.state), None)
    with SnapshotStore(path, ram_bytes=0, disk_bytes=1 << 34, secret=secret) as store:
        point = RestorePoint(len(tokens), 0, KIND_PREFIX)
        StoredStates(store, "bench").save(captured, "default", [point])
        store.flush()
    return tokens


def blocks_row(
    table: Table, name: str, snapshot: Snapshot, secret: bytes | None, repeat: int, runs: int
) -> None:
    """A restore from shared blocks through a real store opened afresh on the directory: look up the
    record, fetch each block (index lookup, read, verify, decompress), and assemble one blob; in
    turn, the same with a sliding window padded; then the same in new processes."""
    split = split_state(snapshot.state)
    if split is None:
        table.add(name, secret is not None, *["-"] * 9)
        return
    whole = np.frombuffer(snapshot.state, dtype=np.uint8)
    padded_state = pad_window(whole, parse_sections(whole)) if split.windows else None
    expected = {False: bytes(snapshot.state), True: b"" if padded_state is None else padded_state.tobytes()}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "c"
        tokens = save_blocks(path, snapshot, split, secret)
        n = len(tokens)
        with SnapshotStore(path, ram_bytes=0, disk_bytes=1 << 34, secret=secret) as store:
            n_blocks = sum(1 for row in store.entries(blocks=True) if row.key.is_block)
        finds: dict[bool, list[float]] = {False: [], True: []}
        orders = [(False, True), (True, False)] if padded_state is not None else [(False,), (False,)]
        for i in range(repeat):
            for pad in orders[i % 2]:  # bare and padded in turn, each first half of the time
                with SnapshotStore(path, ram_bytes=0, disk_bytes=1 << 34, secret=secret) as store:
                    states = StoredStates(store, "bench")
                    start = time.perf_counter()
                    found = states.find(tokens, "default", blocks_alone=not split.windows, pad_windows=pad)
                    finds[pad].append(time.perf_counter() - start)
                    assert found is not None
                    assert bytes(found.snapshot.state) == expected[pad]
        first, grew = first_find(path, n, secret, not split.windows, runs)
    median = statistics.median(finds[False])
    padded = round(statistics.median(finds[True]) * 1e3, 1) if finds[True] else "-"
    state_bytes = len(snapshot.state)
    table.add(
        name,
        secret is not None,
        n_blocks,
        round(state_bytes / 2**20, 1),
        round(median * 1e3, 1),
        round(min(finds[False]) * 1e3, 1),
        round(state_bytes / median / 1e9, 2),
        round(state_bytes / min(finds[False]) / 1e9, 2),
        padded,
        round(first * 1e3, 1),
        round(grew / 2**20, 1) if grew >= 0 else "-",
    )


_CORE_FINDS = """
import json, os, sys, time
path, n, cores, repeat, blocks_alone = json.loads(sys.argv[1])
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])  # before snapcache counts its cores
import numpy as np
from pathlib import Path
from snapcache.formats import codec
from snapcache.llama.stored.stored_states import StoredStates
from snapcache.store import SnapshotStore

assert codec.DEFAULT_THREADS == cores
tokens = np.arange(1, n + 1, dtype=np.int32)  # as snapshot_of() made them
finds = []
for _ in range(repeat + 1):  # the first, a new process's, is left out
    with SnapshotStore(Path(path), ram_bytes=0, disk_bytes=1 << 34) as store:
        states = StoredStates(store, "bench")
        start, cpu = time.perf_counter(), time.process_time()
        found = states.find(tokens, "default", blocks_alone=blocks_alone)
        finds.append((time.perf_counter() - start, time.process_time() - cpu))
        assert found is not None and found.snapshot.key.token_count == n
    del found
print(json.dumps(finds[1:]))
"""


def cores_row(table: Table, name: str, snapshot: Snapshot, repeat: int, runs: int) -> None:
    """The restore of `blocks_row`, no MAC, in processes allowed one core and two in turn (`runs` of
    each, `repeat` finds each after a first): what the second core adds to a restore on this machine."""
    split = split_state(snapshot.state)
    if split is None or not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        table.add(name, *["-"] * 6)
        return
    finds: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "c"
        n = len(save_blocks(path, snapshot, split, None))
        for run in range(runs):
            for cores in (1, 2) if run % 2 == 0 else (2, 1):
                argument = json.dumps([str(path), n, cores, repeat, not split.windows])
                out = subprocess.run(
                    [sys.executable, "-c", _CORE_FINDS, argument], capture_output=True, text=True, check=True
                )
                finds[cores] += [(took, cpu) for took, cpu in json.loads(out.stdout)]
    (one, one_cpu), (two, two_cpu) = (
        (statistics.median(took for took, _ in found), statistics.median(cpu for _, cpu in found))
        for found in (finds[1], finds[2])
    )
    milliseconds = [round(seconds * 1e3, 1) for seconds in (one, one_cpu, two, two_cpu)]
    table.add(name, round(len(snapshot.state) / 2**20, 1), *milliseconds, f"{one / two:.2f}x")


def one_file_row(table: Table, name: str, snapshot: Snapshot, repeat: int) -> None:
    """The full-attention blocks of `snapshot` copied into one blob three ways, in turn: from a store
    opened afresh on the blocks as a save stores them (pack files: one header and one open for up to
    64 blocks); from a store opened afresh on the same blocks in a file each (the layout before
    packs: a file, a header and an index row per block); and from one file of their payloads alone
    (one read, then each XXH3-checked: a floor no store reaches). Each block is then decoded and
    placed on the same threads."""
    split = split_state(snapshot.state)
    if split is None:
        table.add(name, *["-"] * 10)
        return
    n_blocks = split.n_cells // BLOCK_TOKENS
    blocks = [split.block(i) for i in range(n_blocks)]
    payloads = [codec.compress(block) for block in blocks]
    digests = [xxhash.xxh3_128_digest(payload) for payload in payloads]
    expected = bytes(
        _blocks_blob(lambda copy: [copy(i, memoryview(b)) for i, b in enumerate(blocks)], n_blocks)
    )
    with tempfile.TemporaryDirectory() as directory:
        packed = Path(directory) / "packs"
        saved = save_blocks(packed, snapshot, split, None)
        keys = block_keys("bench", "default", saved, n_blocks)
        one_each = Path(directory) / "one-each"
        tier = DiskTier(one_each, 1 << 34)
        try:
            for i, key in enumerate(keys):
                tokens = saved[i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS]
                assert tier.put(Snapshot(key, tokens, blocks[i]))
        finally:
            tier.close()
        payload_file = Path(directory) / "payloads.bin"
        payload_file.write_bytes(b"".join(payloads))

        def from_payloads(i: int, payload: memoryview) -> memoryview:
            if xxhash.xxh3_128_digest(payload) != digests[i]:
                raise ValueError("damaged")
            state = decode_buffer(len(blocks[i]))
            codec.decompress_into(payload, state)
            return state

        stores = {"packs": packed, "file per block": one_each}
        times: dict[str, list[float]] = {label: [] for label in (*stores, "one file")}
        for _ in range(repeat):
            for label, path in stores.items():
                with SnapshotStore(path, ram_bytes=0, disk_bytes=1 << 34) as store:  # opened untimed
                    start = time.perf_counter()
                    blob = _blocks_blob(lambda copy: store.copy_blocks(keys, copy), n_blocks)
                    times[label].append(time.perf_counter() - start)
                assert bytes(blob) == expected
            start = time.perf_counter()
            blob = _blob_from_one_file(payload_file, _ends(payloads), from_payloads, n_blocks)
            times["one file"].append(time.perf_counter() - start)
            assert bytes(blob) == expected
            del blob
        pack_files = len(os.listdir(packed / FILES_DIR)) - 1  # less the record's file
    medians = {label: statistics.median(values) for label, values in times.items()}
    blob_bytes = len(expected)
    cells: list[object] = []
    for label in times:
        cells += [round(medians[label] * 1e3, 1), round(blob_bytes / medians[label] / 1e9, 2)]
    table.add(
        name,
        f"{n_blocks} in {pack_files}",
        round(blob_bytes / 2**20, 1),
        *cells,
        f"{medians['file per block'] / medians['packs']:.2f}x",
        f"{medians['packs'] / medians['one file']:.2f}x",
    )


def _ends(parts: list[bytes]) -> list[int]:
    return [int(end) for end in np.cumsum([len(part) for part in parts])]


def _blob_from_one_file(file: Path, ends: list[int], decode: Any, n_blocks: int) -> memoryview:
    """The blob of the `n_blocks` blocks in `file`, read at once: `decode(i, bytes)` checks and
    decodes block i, which ends at `ends[i]`, on the codec's threads."""
    data = read_file(file)

    def copy_all(copy: Any) -> None:
        def one(i: int) -> None:
            copy(i, decode(i, data[(ends[i - 1] if i else 0) : ends[i]]))

        map_in_parallel(one, range(n_blocks))

    return _blocks_blob(copy_all, n_blocks)


def _blocks_blob(copy_blocks: Any, n_blocks: int) -> memoryview:
    """The blob of `n_blocks` blocks that `copy_blocks(place)` hands over."""
    assembly = Assembly(n_blocks, None)
    copy_blocks(assembly.place)
    return assembly.finish()


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="hits per row (the median is shown)")
    parser.add_argument("--runs", type=int, default=5, help="new processes per first-hit row")
    parser.add_argument("--fresh", action="store_true", help="capture the states again")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    states: dict[str, Snapshot] = {}
    if args.quick:
        tiny = bench_codec.real_states(448, args.fresh, gemma=False)["tiny llama f16 KV"]
        states["tiny llama, 448 tokens"] = snapshot_of(tiny, 448, 256)
    else:
        for n_tokens in (1200, LONG_TOKENS):
            state = bench_codec.capture_gemma_state(n_tokens, fresh=args.fresh)
            if state is None:
                raise SystemExit("the Gemma demo model is not installed (or use --quick)")
            states[f"gemma f16 KV, {n_tokens:,} tokens"] = snapshot_of(state, n_tokens, GEMMA_VOCABULARY)

    hits = Table(
        f"disk hit end to end: read + verify + decompress into one buffer (median of {args.repeat}; "
        f"format 2 decodes on {codec.DEFAULT_THREADS} threads)",
        [
            "state",
            "state MiB",
            "format",
            "MAC",
            "file MiB",
            "read ms",
            "verify+decode ms",
            "hit ms",
            "best ms",
            "CPU ms",
            "state GB/s",
            "GB/CPU-s",
        ],
    )
    rows = [
        hit_row(hits, name, snapshot, version, secret, args.repeat)
        for name, snapshot in states.items()
        for version in (1, 2)
        for secret in (None, SECRET)
    ]
    hits.notes.append(
        "format 1: one zstd frame (level 1) of the numpy-shuffled state, SHA-256 of the payload with a MAC"
    )
    hits.notes.append(
        "format 2: blosc2 chunks (zstd level 1, 2-byte shuffle), XXH3-128 of the payload, BLAKE3 with a MAC"
    )
    hits.notes.append("CPU ms counts every thread of the process; the file comes from the page cache")
    hits.notes.append("GB/CPU-s: state per second of CPU, what one free core would reach (two do better)")

    first = Table(
        f"a new process's first hit, no MAC (median of {args.runs} processes)",
        ["state", "format", "blosc2 import", "import snapcache ms", "then blosc2 ms", "hit ms", "state GB/s"],
    )
    for name, snapshot in states.items():
        first_hit_rows(first, name, snapshot, args.runs, None if args.quick else bench_codec.gemma_path())
    first.notes.append("the hit pays the page faults of its fresh buffers")
    first.notes.append("blosc2 import under way: the hit comes right after `import snapcache`, and waits")
    first.notes.append("behind model load: Gemma loads first; 'then blosc2' is what is left of its import")

    tier = Table(
        f"DiskTier, format 2: put (encode + write + fsync + commit) and get (median of {args.repeat})",
        ["state", "MAC", "put ms", "get ms", "get best ms", "state GB/s"],
    )
    for name, snapshot in states.items():
        for secret in (None, SECRET):
            tier_row(tier, name, snapshot, secret, args.repeat)
    blocks = Table(
        f"restore from shared 64-token blocks, a store opened afresh each time (median of {args.repeat})",
        [
            "state",
            "MAC",
            "blocks",
            "state MiB",
            "find ms",
            "best ms",
            "state GB/s",
            "best GB/s",
            "padded ms",
            "new process ms",
            "then holds MiB",
        ],
    )
    for name, snapshot in states.items():
        for secret in (None, SECRET):
            blocks_row(blocks, name, snapshot, secret, args.repeat, args.runs)
    blocks.notes.append("find: record lookup, every block read + verified + decompressed, one blob assembled")
    blocks.notes.append(
        f"new process: its first find (median of {args.runs}), with a 256 MiB RAM tier; then holds: the"
        " memory it holds beyond what it held before, the restored blob included"
    )
    blocks.notes.append("Gemma's sliding-window cache is in the record; its full-attention cache in blocks")
    blocks.notes.append(
        "padded ms: the same find, in turn with the others, with the window padded as CachedLlama restores"
        " it into a Llama with a full-size window cache (--swa-cache full, llama-cpp-python's default)"
    )
    cores = Table(
        f"the restore from blocks on one core and on two: new processes in turn, {args.runs} of each,"
        f" {args.repeat} finds each after its first, a store opened afresh each time (median)",
        ["state", "state MiB", "one core ms", "CPU ms", "two cores ms", "CPU ms", "one/two"],
    )
    for name, snapshot in states.items():
        cores_row(cores, name, snapshot, args.repeat, args.runs)
    cores.notes.append(
        "one core: a process whose affinity allows one core, where snapcache decodes on one thread;"
        " CPU ms: the process's CPU time during a find, every thread's"
    )
    one_file = Table(
        f"the blocks alone into one blob: from a store of pack files, from a store of a file per block,"
        f" from one file of their payloads (median of {args.repeat}, in turn)",
        [
            "state",
            "blocks in packs",
            "blob MiB",
            "packs ms",
            "GB/s",
            "file per block ms",
            "GB/s",
            "one file ms",
            "GB/s",
            "per block/packs",
            "packs/one file",
        ],
    )
    for name, snapshot in states.items():
        one_file_row(one_file, name, snapshot, args.repeat)
    one_file.notes.append(
        "packs: SnapshotStore.copy_blocks in a store opened afresh, untimed, on the blocks as a save"
        " stores them: pack files of up to 64 blocks (an index query, per pack one open and one header"
        " checked, per block its bytes read and XXH3-checked, the uses handed to their recorder thread)"
    )
    one_file.notes.append(
        "file per block: the same on the same blocks written by DiskTier.put one by one, the layout"
        " before packs (per block a file, a header, its tokens and payload verified)"
    )
    one_file.notes.append(
        "one file: the blocks' payloads alone in one file, read at once, each XXH3-checked: no index, no"
        " header (not a layout the store writes; all three decode and place on the same threads)"
    )
    load_after = os.getloadavg()[0]
    hits.notes.append(f"load average {load_before:.1f} before, {load_after:.1f} after (other work slows it)")
    tables = [hits, first, tier, blocks, cores, one_file]
    report("bench_disk_hit", tables, args.json, quick=args.quick, extra={"hits": rows})


if __name__ == "__main__":
    main()
