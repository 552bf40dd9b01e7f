"""Prompts that share 64-token blocks, and how a worker and a test complete them on the tiny model.

Two texts share their first few hundred tokens; every prompt is a token prefix of one of them, so
prompts of one text share all their whole blocks and the two texts share their first blocks.
"""

from __future__ import annotations

import json
from typing import Any

SCOPE = "blocks-reliability"
N_CTX = 2048
MAX_TOKENS = 8
# Prompt lengths in tokens (the tiny model's byte vocabulary makes a token of every byte).
LENGTHS = (150, 290, 420, 530, 660, 790, 920)
_SHARED = (
    "Field notes, day one: the heron waited at the weir while two otters fished below the mill. "
    "A kingfisher crossed the pool twice, and the water ran clear over the gravel bars. "
    "By noon the wind turned west and the reeds bent low along the southern bank. "
)
TEXTS = (
    _SHARED + "In the afternoon we walked upstream to the old bridge, counting swallows and dragonflies, "
    "and found the footprints of a badger in the mud beside the alder roots. The miller said "
    "the river had risen twice that spring. At dusk the bats came out over the meadow, and "
    "an owl called from the beech wood until long after the lamps were lit in the village. "
    "Day two began with rain; the weir roared and the heron stood on one leg for an hour.",
    _SHARED + "The second team went downstream instead, past the ferry and the salt marsh, where curlews "
    "and redshanks fed on the falling tide. They measured the channel at six places, took "
    "samples of the silt, and watched a seal haul out on the sandbank opposite the harbour. "
    "On the way back the tide turned quickly, and the boat scraped the shingle near the "
    "lighthouse before the pilot found the deeper water beyond the moored yachts and buoys.",
)


def prompt_tokens(llm: Any, text: int, length: int) -> list[int]:
    """The first `length` tokens of text number `text`."""
    tokens = [int(t) for t in llm.tokenize(TEXTS[text].encode())]
    if length > len(tokens):
        raise ValueError(f"text {text} has only {len(tokens)} tokens")
    return tokens[:length]


def complete(completer: Any, prompt: list[int]) -> list[int]:
    """A greedy completion of `prompt` by a Llama or a CachedLlama; the context it left (the prompt
    and the generated tokens but the last)."""
    completer.create_completion(prompt, temperature=0.0, max_tokens=MAX_TOKENS)
    llm = getattr(completer, "llm", completer)
    return [int(t) for t in llm.input_ids[: llm.n_tokens]]


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
