"""`snapcache serve` chooses exact or inexact restores by what the build can do, and says which.

A build on which no prompt split point keeps the results bit for bit (what a CUDA build measures) is
stood in for by the cache directory's fingerprint notes, which hold what the alignment probe found
for a model the first time it was loaded: changed here to say that no split point holds. The default (`auto`)
then caches inexactly and names the reason on `/snapcache/why`, `/snapcache/stats` and `/metrics`;
`--exact` caches nothing.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from server_process import ServerProcess, http_json, running_server

pytestmark = [pytest.mark.model]

N_CTX = 2048
PROMPT = "The ledger of the corner shop, day by day: lamps, chairs and tables sold before noon. " * 6
NO_SPLIT = "no prompt split point keeps this llama.cpp build's results bit for bit"


def no_split_point_noted(model: Path, cache_dir: Path, log: Path, *extra: str) -> None:
    """Load `model` once as the server will (its probe notes an alignment), then change the note to
    what a build on which no split point holds would have noted."""
    with running_server(model, cache_dir, log, *extra, n_ctx=N_CTX) as server:
        _, stats, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
    note_path = cache_dir / "fingerprints" / f"{stats['model_fingerprint']}.json"
    note = json.loads(note_path.read_text())
    assert isinstance(note["alignment"], int)  # measured on this CPU build
    note_path.write_text(json.dumps({**note, "alignment": None}))


def cached_tokens(server: ServerProcess) -> int:
    body = json.dumps({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}).encode()
    status, answer, _ = http_json("POST", f"{server.base_url}/v1/completions", body)
    assert status == 200, answer
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as response:
        return str(response.read().decode())


@pytest.mark.parametrize("parallel", ["1", "4"])
def test_auto_caches_inexactly_where_no_split_point_holds_and_says_why(
    tiny_model_path: Path, tmp_path: Path, parallel: str
) -> None:
    cache_dir = tmp_path / "cache"
    no_split_point_noted(tiny_model_path, cache_dir, tmp_path / "probe.log", "--parallel", parallel)
    with running_server(
        tiny_model_path, cache_dir, tmp_path / "serve.log", "--parallel", parallel, n_ctx=N_CTX
    ) as server:
        cached_tokens(server)
        assert cached_tokens(server) > 0
        status, why, _ = http_json("GET", f"{server.base_url}/snapcache/why")
        assert status == 200, why
        assert why["exactness"] == {"mode": "inexact", "asked": "auto", "reason": NO_SPLIT}
        _, stats, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
        assert stats["exactness"]["mode"] == "inexact"
        assert 'snapcache_exactness_info{asked="auto",mode="inexact",reason="no prompt split' in metrics(
            server
        )
        assert server.log().count("exactness: inexact (auto: no prompt split point") == 1


def test_exact_caches_nothing_where_no_split_point_holds(tiny_model_path: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    no_split_point_noted(tiny_model_path, cache_dir, tmp_path / "probe.log")
    with running_server(tiny_model_path, cache_dir, tmp_path / "serve.log", "--exact", n_ctx=N_CTX) as server:
        cached_tokens(server)
        assert cached_tokens(server) == 0
        _, why, _ = http_json("GET", f"{server.base_url}/snapcache/why")
        assert why["exactness"]["mode"] == "exact"
        assert why["exactness"]["asked"] is True


def test_auto_is_exact_on_this_cpu_build(tiny_model_path: Path, tmp_path: Path) -> None:
    with running_server(tiny_model_path, tmp_path / "cache", tmp_path / "serve.log", n_ctx=N_CTX) as server:
        cached_tokens(server)
        assert cached_tokens(server) > 0
        _, why, _ = http_json("GET", f"{server.base_url}/snapcache/why")
        assert why["exactness"]["mode"] == "exact"
        assert why["exactness"]["asked"] == "auto"
        assert 'snapcache_exactness_info{asked="auto",mode="exact"' in metrics(server)
        _, stats, _ = http_json("GET", f"{server.base_url}/snapcache/stats")
        assert stats["pinned_memory"] is None  # the K/V cache is in host memory: nothing pinned


def test_exact_and_inexact_together_are_refused(tiny_model_path: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    command = [sys.executable, "-m", "snapcache", "serve", str(tiny_model_path), "--exact", "--inexact"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "--exact and --inexact ask for opposite things" in done.stderr
    assert "Traceback" not in done.stderr


def test_doctor_names_what_auto_chose_for_the_models_probed_here(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    cache_dir = tmp_path / "cache"
    no_split_point_noted(tiny_model_path, cache_dir, tmp_path / "probe.log")
    command = [sys.executable, "-m", "snapcache", "--cache-dir", str(cache_dir), "doctor", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    [check] = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "exactness"]
    assert check["detail"].startswith("auto (the default")
    assert "of the 1 model settings probed here, 0 restore exactly and 1 inexactly" in check["detail"]


def test_flash_attention_on_over_f16_restores_inexactly_by_default_and_nothing_when_exact(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """On the CPU, flash attention over an F16 cache reads short batches with other kernels."""
    for extra, restored, mode in (((), True, "inexact"), (("--exact",), False, "exact")):
        folder = tmp_path / mode
        folder.mkdir()
        with running_server(
            tiny_model_path, folder / "cache", folder / "serve.log", "--flash-attn", "on", *extra, n_ctx=N_CTX
        ) as server:
            cached_tokens(server)
            assert (cached_tokens(server) > 0) is restored, mode
            _, why, _ = http_json("GET", f"{server.base_url}/snapcache/why")
            assert why["exactness"]["mode"] == mode
            assert "flash attention" in server.log()  # each says why
