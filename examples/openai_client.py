"""Talk to `snapcache serve` with the OpenAI SDK: the same system prompt, a new question each time.

Start the server first (`snapcache serve`, or `make serve`), then run this a few times, with a
restart of the server in between if you like: only the first run reads the system prompt.

    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1] [--scope desk]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from openai import OpenAI

SYSTEM_PROMPT = (Path(__file__).parent / "system_prompt.txt").read_text()
QUESTIONS = ("Where did I save the invoice from the plumber?", "Which folder holds my tax papers?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--scope", default="desk", help="the X-Snapcache-Scope header")
    parser.add_argument("--api-key", default="unused", help="the server's --api-key, if it has one")
    args = parser.parse_args()

    client = OpenAI(
        base_url=args.base_url, api_key=args.api_key, default_headers={"X-Snapcache-Scope": args.scope}
    )
    for question in QUESTIONS:
        started = time.perf_counter()
        stream = client.chat.completions.create(
            model="default",
            messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        first_token, reply, usage = None, "", None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first_token = first_token or time.perf_counter() - started
                reply += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        cached = usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else 0
        prompt_tokens = usage.prompt_tokens if usage else 0
        print(f"question:    {question}")
        print(f"first token: {first_token or 0:.2f} s ({cached} of {prompt_tokens} prompt tokens cached)")
        print(f"reply:       {' '.join(reply.split())[:90]}...")


if __name__ == "__main__":
    main()
