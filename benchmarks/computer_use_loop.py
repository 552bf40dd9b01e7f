"""A computer-use loop (a screenshot a turn, five kept): prompt tokens read afresh, against llama-server.

A desktop agent sends its system prompt, the turns so far and a new screenshot every turn. It keeps
the last `--keep` screenshots and replaces older ones with a line of text, as UI-TARS does, so that
from the sixth turn on the oldest image leaves the prompt and everything after its place is new to
any prefix cache. Both sides get the same chats, greedy, with fixed answers in the history:

- snapcache: `CachedLlama(llm, store, mmproj=...)` in this process, on a disk store;
- snapcache serve: `--mmproj` (its defaults otherwise: `--parallel 4`, a disk cache), over its Chat
  Completions API;
- llama-server: `--mmproj`, `--cache-ram`, over its Chat Completions API (for both servers, the
  tokens read are the prompt's less its `cached_tokens`).

After the last turn all restart (snapcache: a new Llama and store over the same directory, what a
new process has; the servers: a new process) and answer one more turn. The model is the suite's tiny
vision model (random weights; an image is `--image-tokens` embeddings, 256 by default, as Gemma 3's):
what is measured is which tokens each side reads, not how fast. No vision model that both load is
available to the runs here.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _common import ROOT, Table, make_parser, report

sys.path.insert(0, str(ROOT / "tests"))

from image_files import picture, png
from tiny_model import write_tiny_vision_model

N_CTX = 4096  # the tiny model's training context, which llama-server keeps to
THREADS = 2
DEFAULT_LLAMA_SERVER = ROOT / "benchmarks" / "results" / "llama-server-build" / "bin" / "llama-server"
SYSTEM = (
    "You are a computer-use agent. Each turn you get the user's goal and a screenshot of the screen. "
    "Find the control that moves the goal forward and answer with one action: click(x, y), type(text) "
    "or scroll(direction). "
) * 2
OPTIONS: dict[str, Any] = {"temperature": 0.0, "max_tokens": 4}
BIAS = {3 + byte: -100.0 for byte in range(0x80, 0x100)}  # no byte above 0x7F from the random model


def screenshot_url(turn: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(picture(1000 + turn, 128, 128))).decode()


def chat(turn: int, keep: int) -> list[dict[str, Any]]:
    """The chat of turn `turn` (from 1): every earlier turn, its screenshot kept if among the last
    `keep`, its fixed answer, then this turn's goal and screenshot."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for past in range(1, turn + 1):
        goal = f"Step {past}: go on."
        if past > turn - keep:
            content: Any = [
                {"type": "text", "text": goal},
                {"type": "image_url", "image_url": {"url": screenshot_url(past)}},
            ]
        else:
            content = goal + " [screenshot omitted]"
        messages.append({"role": "user", "content": content})
        if past < turn:
            messages.append({"role": "assistant", "content": f"click({100 + past}, {200 + past})"})
    return messages


class Snapcache:
    """The loop's turns through CachedLlama with a projector, on a disk store under `directory`."""

    def __init__(self, model: Path, mmproj: Path, directory: Path) -> None:
        self._model, self._mmproj, self._directory = model, mmproj, directory
        self._start()

    def _start(self) -> None:
        from snapcache import CachedLlama, SnapshotStore, load_llama

        self._llm = load_llama(self._model, n_ctx=N_CTX, n_threads=THREADS, verbose=False)
        self._store = SnapshotStore(self._directory)
        self._cached = CachedLlama(self._llm, self._store, scope="computer-use", mmproj=self._mmproj)

    def restart(self) -> None:
        self._store.close()
        self._llm.close()
        self._start()

    def turn(self, messages: list[dict[str, Any]]) -> tuple[int, int]:
        """(prompt tokens, tokens read afresh)."""
        self._cached.create_chat_completion(messages, logit_bias=BIAS, **OPTIONS)
        restore = self._cached.last_restore
        assert restore is not None
        return restore.prompt_tokens, restore.evaluated_tokens

    def close(self) -> None:
        self._store.close()
        self._llm.close()


class _ChatServer:
    """A server process whose Chat Completions API answers the loop's turns: started, restarted
    (a new process), asked, stopped."""

    name = ""

    def __init__(self, command: list[str], workdir: Path, port: int, ready: str) -> None:
        self.command = command
        self._log = workdir / f"{self.name}.log"
        self._base = f"http://127.0.0.1:{port}"
        self._ready = ready
        self._process: subprocess.Popen[bytes] | None = None
        self._start()

    def _start(self) -> None:
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self._base + self._ready, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start: see {self._log}")

    def restart(self) -> None:
        self.close()
        self._start()

    def _bias(self) -> Any:
        return {str(token): bias for token, bias in BIAS.items()}

    def turn(self, messages: list[dict[str, Any]]) -> tuple[int, int]:
        """(prompt tokens, tokens read afresh: the prompt's less its `cached_tokens`)."""
        body = {"model": "m", "messages": messages, "logit_bias": self._bias(), **OPTIONS}
        request = urllib.request.Request(
            self._base + "/v1/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "X-Snapcache-Scope": "computer-use"},
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                result = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{self.name} answered {exc.code}: {exc.read()[:500]!r}") from None
        usage = result["usage"]
        prompt = int(usage["prompt_tokens"])
        return prompt, prompt - int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))

    def close(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(30)
            self._process = None


class SnapcacheServe(_ChatServer):
    """The loop's turns through `snapcache serve --mmproj`, its cache on disk under `directory`."""

    name = "snapcache serve"

    def __init__(self, model: Path, mmproj: Path, directory: Path, workdir: Path, port: int) -> None:
        command = [sys.executable, "-m", "snapcache", "--cache-dir", str(directory), "serve", str(model)]
        command += ["--mmproj", str(mmproj), "--n-ctx", str(N_CTX), "--threads", str(THREADS)]
        super().__init__([*command, "--port", str(port)], workdir, port, "/v1/models")


class LlamaServer(_ChatServer):
    """The loop's turns through llama-server with `--mmproj` and `--cache-ram`."""

    name = "llama-server"

    def __init__(self, binary: Path, model: Path, mmproj: Path, workdir: Path, port: int) -> None:
        command = [str(binary), "-m", str(model), "--mmproj", str(mmproj), "-c", str(N_CTX), "-np", "1"]
        command += ["-t", str(THREADS), "-tb", str(THREADS), "--cache-ram", "2048", "--jinja", "--no-webui"]
        super().__init__([*command, "--host", "127.0.0.1", "--port", str(port)], workdir, port, "/health")

    def _bias(self) -> Any:
        return [[token, bias] for token, bias in BIAS.items()]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=12, help="turns before the restart (default 12)")
    parser.add_argument("--keep", type=int, default=5, help="screenshots kept in the chat (default 5)")
    parser.add_argument(
        "--image-tokens",
        type=int,
        default=256,
        choices=(64, 256, 1024),
        help="embeddings an image is read as (default 256, as Gemma 3's)",
    )
    parser.add_argument(
        "--llama-server",
        type=Path,
        default=DEFAULT_LLAMA_SERVER,
        help="the llama-server binary (default: the one benchmarks/ builds)",
    )
    args = parser.parse_args()
    turns = 4 if args.quick else args.turns
    workdir = Path(tempfile.mkdtemp(prefix="computer-use-"))
    sides: dict[str, Any] = {}
    try:
        size = int(args.image_tokens**0.5) * 8
        model, mmproj = write_tiny_vision_model(workdir, image_size=size)
        sides["snapcache"] = Snapcache(model, mmproj, workdir / "store")
        sides["snapcache serve"] = SnapcacheServe(model, mmproj, workdir / "served", workdir, _free_port())
        if args.llama_server.exists():
            sides["llama-server"] = LlamaServer(args.llama_server, model, mmproj, workdir, _free_port())
        table = Table(
            f"Prompt tokens read afresh per turn ({args.image_tokens} tokens a screenshot,"
            f" the last {args.keep} kept)",
            ["turn", *(f"{name} prompt" for name in sides), *(f"{name} read" for name in sides)],
        )
        totals = dict.fromkeys(sides, 0)
        for turn in range(1, turns + 2):
            if turn == turns + 1:
                for side in sides.values():
                    side.restart()
            messages = chat(turn, args.keep)
            results = {name: side.turn(messages) for name, side in sides.items()}
            for name, (_, read) in results.items():
                totals[name] += read
            label = f"{turn} after a restart" if turn == turns + 1 else str(turn)
            table.add(label, *(results[n][0] for n in sides), *(results[n][1] for n in sides))
        table.add("all turns", *("" for _ in sides), *(totals[n] for n in sides))
        if turns + 1 > args.keep:
            table.notes.append(
                f"from turn {args.keep + 1} on, the oldest screenshot kept becomes text: the prompt changes"
                " at its place, and any prefix cache reads the rest of the chat again"
            )
        table.notes.append(
            "prompt: the prompt's tokens as each side renders and counts them (templates differ); read: "
            "the tokens llama.cpp read for it (snapcache: evaluated_tokens; the servers: prompt_tokens less "
            "usage.prompt_tokens_details.cached_tokens)"
        )
        served = sides["snapcache serve"].command
        table.notes.append(
            f"snapcache serve: {' '.join(served[served.index('--mmproj') : -2])}".replace(str(workdir), "…")
        )
        if "llama-server" in sides:
            command = " ".join(sides["llama-server"].command[1:-4]).replace(str(workdir), "…")
            table.notes.append(f"llama-server: {command}")
        else:
            table.notes.append(f"llama-server not run: no binary at {args.llama_server}")
        report(
            "computer_use_loop",
            [table],
            args.json,
            quick=args.quick,
            extra={"model": f"tiny vision model (random weights), {args.image_tokens} tokens an image"},
        )
    finally:
        for side in sides.values():
            side.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
