"""The batched context with its K/V cache on the device: four sequences at once, restored from the
store through the pinned staging buffer (`Scheduler`, without HTTP), and `snapcache serve --parallel 4`
answering a burst after a restart from the disk tier. In the exact batch mode each answer is the one
the request gets alone, from cold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from server_process import ServerProcess, http_json, running_server, wait_until_written

from snapcache.llama.batch import SamplingParams, Scheduler
from snapcache.llama.state.host_memory import pinned_report
from snapcache.store import SnapshotStore

pytestmark = pytest.mark.model

openai = pytest.importorskip("openai")

N_CTX = 1024
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
SYSTEM = "You are a careful desktop assistant. Answer briefly and plainly. " * 4
QUESTIONS = [f"Question {i}: where is the {word}?" for i, word in enumerate(["fox", "dog", "cat", "owl"])]
# System prompts of four lengths: the tiny model's answers differ with them.
SYSTEMS = [f"You are agent number {i}. " + SYSTEM[: 120 + 41 * i] for i in range(4)]


def prompts(llm: llama_cpp.Llama) -> list[list[int]]:
    return [
        llm.tokenize(f"{SYSTEM}Question {i}: {'the quick brown fox ' * (3 + 5 * i)}?".encode())
        for i in range(4)
    ]


def alone(llm: llama_cpp.Llama, prompt: Sequence[int]) -> list[int]:
    """The request on the Llama's own one-sequence context, from cold."""
    llm.reset()
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0):
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token) or len(out) >= 16:
            break
        out.append(token)
    return out


def test_four_sequences_restore_from_the_store_as_each_answers_alone(
    gpu: Any, on_gpu: Any, tiny_model_path: Path, store: SnapshotStore
) -> None:
    llm = on_gpu(tiny_model_path, n_ctx=N_CTX)
    asked = prompts(llm)
    expected = [alone(llm, prompt) for prompt in asked]
    with Scheduler(llm, store, n_seq=4, mode="exact") as reading:
        first = [request.result(300) for request in [reading.submit(p, GREEDY) for p in asked]]
    # A new scheduler holds nothing live: each request restores from the store.
    with Scheduler(llm, store, n_seq=4, mode="exact") as restoring:
        requests = [restoring.submit(p, GREEDY) for p in asked]
        again = [request.result(300) for request in requests]
        held = pinned_report()
    assert first == expected
    assert again == expected
    for request in requests:
        assert request.restore is not None
        assert request.restore.restored_tokens >= 64
    if gpu.host_buffer_type:  # the restores were staged in the device's pinned memory
        assert held is not None
        assert held["buffer_type"] == gpu.host_buffer_type


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        start.wait()
        return call()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


def ask(server: ServerProcess, question: str, system: str, scope: str) -> tuple[str, int, str]:
    """One greedy streamed chat turn: (text, restored tokens, where they came from)."""
    api = openai.OpenAI(
        base_url=server.api_url, api_key="unused", max_retries=0, default_headers={"X-Snapcache-Scope": scope}
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    raw = api.chat.completions.with_raw_response.create(
        model="m", messages=messages, temperature=0, max_tokens=16, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    return text, int(raw.headers["x-snapcache-restored-tokens"]), raw.headers["x-snapcache-source"]


def test_serve_parallel_4_answers_a_burst_after_a_restart_from_disk(
    gpu: Any, tiny_model_path: Path, tmp_path: Path
) -> None:
    with running_server(
        tiny_model_path, tmp_path / "cold", tmp_path / "cold.log", "--parallel", "1"
    ) as single:
        cold = [ask(single, QUESTIONS[1], system, f"cold-{i}")[0] for i, system in enumerate(SYSTEMS)]
    cache = tmp_path / "cache"
    options = ("--parallel", "4", "--batch-mode", "exact")
    with running_server(tiny_model_path, cache, tmp_path / "first.log", *options) as first:
        at_once([lambda i=i: ask(first, QUESTIONS[0], SYSTEMS[i], f"agent-{i}") for i in range(4)])
        wait_until_written(first)
    with running_server(tiny_model_path, cache, tmp_path / "second.log", *options) as second:
        answers = at_once([lambda i=i: ask(second, QUESTIONS[1], SYSTEMS[i], f"agent-{i}") for i in range(4)])
        status, stats, _ = http_json("GET", f"{second.base_url}/snapcache/stats")
    assert status == 200
    print(f"\nserve --parallel 4 on {gpu.describe()}: exactness {stats['exactness']}")
    if gpu.host_buffer_type:
        assert stats["pinned_memory"] is not None, "the states went through plain memory"
        assert stats["pinned_memory"]["buffer_type"] == gpu.host_buffer_type
    for _, restored, source in answers:
        assert restored >= 64
        assert source == "disk"
    assert [text for text, _, _ in answers] == cold
