"""What a grammar costs a generated token: llama-cpp-python's sampler against the batched scheduler's.

    python benchmarks/grammar_sampling.py [--quick] [--tokens 96] [--runs 3] [--json PATH]

One prompt, greedy, --tokens tokens under llama.cpp's JSON grammar (what `response_format`
`json_object` and a tool call's schema turn into) on Gemma-3-270M (262,144 tokens in its vocabulary),
2 threads, three ways, in turn, --runs times:

- without a grammar, on the scheduler (one sequence): the floor;
- with the grammar on the Llama's own path (`Llama.create_completion(grammar=...)`): llama-cpp-python
  puts the grammar in its sampler chain, so every candidate of every step is checked against it;
- with the grammar on the scheduler: the chain picks a token, the grammar judges only that one, and
  only a refused token has the whole vocabulary constrained (as llama.cpp's own sampler does).

Each row: the median seconds of the generation (prompt read included, the same prompt each time),
the tokens generated, milliseconds per token, that against the floor, and whether the text is
llama-cpp-python's (greedy: it must be). --quick uses the tiny model.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import llama_cpp
from _common import Table, choose_model, make_parser, new_llama, report
from llama_cpp.llama_grammar import JSON_GBNF

from snapcache.llama.batch import BatchedLlama, Scheduler

PROMPT = "Describe a small command-line tool as a JSON object with its name, purpose and three options:\n"


def main() -> None:
    parser = make_parser(__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96, help="tokens to generate")
    parser.add_argument("--runs", type=int, default=3, help="runs per way (median)")
    args = parser.parse_args()
    tokens = 16 if args.quick else args.tokens
    runs = 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as folder:
        model = choose_model(args.quick, Path(folder))
        llm = new_llama(model.path, n_ctx=2048)
        grammar = llama_cpp.LlamaGrammar.from_string(JSON_GBNF, verbose=False)
        options: dict[str, Any] = {"temperature": 0.0, "max_tokens": tokens}
        with Scheduler(llm, None, n_seq=1) as scheduler:
            batched = BatchedLlama(scheduler)
            constrained = {**options, "grammar": grammar}
            ways = {
                "no grammar, scheduler": lambda: batched.create_completion(PROMPT, **options),
                "grammar, llama-cpp-python": lambda: llm.create_completion(PROMPT, **constrained),
                "grammar, scheduler": lambda: batched.create_completion(PROMPT, **constrained),
            }
            for run in ways.values():  # warm-up: first decodes, thread pools, the grammar's parse
                run()
            seconds: dict[str, list[float]] = {name: [] for name in ways}
            generated: dict[str, int] = {}
            texts: dict[str, str] = {}
            for _ in range(runs):
                for name, run in ways.items():
                    llm.reset()
                    started = time.perf_counter()
                    result = run()
                    seconds[name].append(time.perf_counter() - started)
                    generated[name] = int(result["usage"]["completion_tokens"])
                    texts[name] = str(result["choices"][0]["text"])
        llm.close()
    table = Table(
        f"{tokens} greedy tokens under llama.cpp's JSON grammar ({model.name}, median of {runs})",
        ["way", "seconds", "tokens", "ms per token", "vs no grammar", "text = llama-cpp-python's"],
    )
    floor = statistics.median(seconds["no grammar, scheduler"]) / max(1, generated["no grammar, scheduler"])
    for name, times in seconds.items():
        median = statistics.median(times)
        per_token = median / max(1, generated[name])
        ratio = f"{per_token / floor:.2f}x"
        reference = texts["grammar, llama-cpp-python"]
        same = "-" if name.startswith("no grammar") else str(texts[name] == reference).lower()
        table.add(name, f"{median:.2f}", str(generated[name]), f"{per_token * 1000:.1f}", ratio, same)
    report("grammar_sampling", [table], args.json, quick=args.quick, extra={"tokens": tokens, "runs": runs})


if __name__ == "__main__":
    main()
