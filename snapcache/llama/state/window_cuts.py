"""When a sliding-window sequence can be cut back and read on exactly as a cold read of the shorter
prompt: from position 0, or, in a window-sized cache, while its ring still holds the cut point's window
(docs/how-it-works/architecture.md, "Sliding windows")."""

from __future__ import annotations

from typing import Any

import llama_cpp

__all__ = ["window_cut_reads_cold", "window_cuts_back"]


def window_cuts_back(memory: Any, model: Any, seq_id: int, n_tokens: int, ring: int) -> bool:
    """Whether a sliding-window sequence cut back to `n_tokens` reads on as a cold read: it holds
    its cells from position 0, or its window-sized cache (`ring` cells per stream, 0: full-size)
    still holds the cut point's window (`window_cut_reads_cold`)."""
    first = int(llama_cpp.llama_memory_seq_pos_min(memory, seq_id))
    last = int(llama_cpp.llama_memory_seq_pos_max(memory, seq_id))
    n_swa = int(llama_cpp.llama_model_n_swa(model))
    return first == 0 or window_cut_reads_cold(first, last, n_tokens, n_swa, ring)


def window_cut_reads_cold(first: int, last: int, n_tokens: int, n_swa: int, ring: int) -> bool:
    """Whether a window-sized sliding-window cache of `ring` cells per stream (0: not one), holding
    positions `first`..`last` of a sequence read cold, cut back to its first `n_tokens` reads on bit
    for bit as a cold read of them (see docs/how-it-works/architecture.md, "Sliding windows").

    A cold read lays position p at slot p % ring and overwrites the oldest cells as it goes round. A
    cut frees the slots of positions `n_tokens`..`last`; where they do not wrap round the ring, the
    search head goes back to slot `n_tokens` % ring, where a cold read's next token goes. The cells
    a cold read of `n_tokens` would have there instead are older than the window of every token to
    come (masked, so they add nothing), and the window of position `n_tokens` is still held:
    `last - n_tokens <= ring - n_swa`."""
    if ring <= 0 or n_swa <= 0 or not 0 < n_tokens <= last:
        return False
    window_held = first <= n_tokens - n_swa + 1 and last - n_tokens <= ring - n_swa
    return window_held and n_tokens // ring == last // ring
