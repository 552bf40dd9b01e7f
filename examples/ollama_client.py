"""Talk to `snapcache serve` with the `ollama` client, as Ollama's desktop tools do: the same system
prompt, a new question each time.

Start the server first (`snapcache serve`, or `make serve`), then run this a few times, with a
restart of the server in between if you like: `prompt_eval_count` is what the model read afresh,
so only the first run reads the system prompt.

    python examples/ollama_client.py [--host http://127.0.0.1:8000] [--scope desk]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ollama

SYSTEM_PROMPT = (Path(__file__).parent / "system_prompt.txt").read_text()
QUESTIONS = ("Where did I save the invoice from the plumber?", "Which folder holds my tax papers?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="http://127.0.0.1:8000")
    parser.add_argument("--scope", default="desk", help="the X-Snapcache-Scope header")
    args = parser.parse_args()

    with ollama.Client(host=args.host, headers={"X-Snapcache-Scope": args.scope}) as client:
        [model] = client.list().models  # the one model the server serves
        for question in QUESTIONS:
            started = time.perf_counter()
            first_token, reply, done = None, "", None
            for part in client.chat(
                model=model.model or "",
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": question},
                ],
                options={"temperature": 0, "num_predict": 24},
                stream=True,
            ):
                if part.message.content:
                    first_token = first_token or time.perf_counter() - started
                    reply += part.message.content
                done = part if part.done else done
            read = done.prompt_eval_count if done is not None else 0
            print(f"question:    {question}")
            print(f"first token: {first_token or 0:.2f} s ({read} prompt tokens read afresh)")
            print(f"reply:       {' '.join(reply.split())[:90]}...")


if __name__ == "__main__":
    main()
