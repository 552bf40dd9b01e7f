"""A desktop agent that reads its long system prompt once, ever.

On start it warms examples/system_prompt.txt into the default store: the first start reads it (a
few seconds on a laptop CPU), every later start finds its state on disk. Then it answers questions,
each restoring the system prompt instead of reading it again.

    python examples/agent.py "Where is the plumber's invoice?"      # answer, then exit
    python examples/agent.py                                         # ask on stdin, one per line
    python examples/agent.py --model other.gguf --chat-format chatml "Hi"
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from llama_cpp import Llama

from snapcache import CachedLlama, ModelError, SnapshotStore, load_llama
from snapcache.llama import route_llama_cpp_log
from snapcache.llama.setup.demo_model import default_model_path

HERE = Path(__file__).resolve().parent
SCOPE = "desktop-agent"


def open_model(model: str | None, chat_format: str | None) -> Llama:
    """The --model (or the embedded demo model) with its chat template; exits with one line if it fails."""
    path = model or default_model_path()
    if path is None:
        sys.exit("no --model given and the demo model is not installed (pip install 'snapcache[demo]')")
    try:
        return load_llama(path, n_ctx=4096, chat_format=chat_format)
    except ModelError as exc:
        sys.exit(f"agent: {exc}")


def answer(agent: CachedLlama, system_prompt: str, question: str) -> None:
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
    started = time.perf_counter()
    first_token = None
    print("agent: ", end="", flush=True)
    for chunk in agent.create_chat_completion(messages, stream=True, temperature=0.2, max_tokens=200):
        text = chunk["choices"][0]["delta"].get("content")
        if text:
            first_token = first_token or time.perf_counter() - started
            print(text, end="", flush=True)
    info = agent.last_restore
    restored = "no restore"
    if info is not None:
        restored = f"{info.restored_tokens} of {info.prompt_tokens} prompt tokens restored"
    print(f"\n  [first token after {1000 * (first_token or 0):.0f} ms; {restored}]")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("questions", nargs="*", help="questions to answer; none: read them from stdin")
    parser.add_argument("--model", help="a GGUF model (default: the embedded Gemma-3-270M)")
    parser.add_argument("--chat-format", help="llama-cpp-python chat format for --model")
    parser.add_argument("--system-prompt", default=str(HERE / "system_prompt.txt"))
    args = parser.parse_args()

    system_prompt = Path(args.system_prompt).read_text()
    started = time.perf_counter()
    route_llama_cpp_log(level=logging.DEBUG)  # llama.cpp's chatter: a debug log line, not stderr
    llm = open_model(args.model, args.chat_format)
    with SnapshotStore() as store:
        agent = CachedLlama(llm, store, scope=SCOPE)
        warmed = agent.warm(system_prompt, priority=10)
        where = "restored from the cache on disk" if warmed.from_cache else "read and saved to the cache"
        print(
            f"ready after {time.perf_counter() - started:.1f} s: system prompt of {warmed.token_count} "
            f"tokens {where} ({warmed.seconds:.2f} s)"
        )
        questions = args.questions or (line.strip() for line in sys.stdin)
        for question in questions:
            if question:
                answer(agent, system_prompt, question)
    return 0


if __name__ == "__main__":
    sys.exit(main())
