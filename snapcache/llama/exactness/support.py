"""Which Llamas a restored state cannot serve exactly: there, every lookup must be a clean miss.

Measured on llama.cpp's CPU backend (llama-cpp-python 0.3.36, tests/test_exactness_matrix.py):
restoring a state and reading on gives bit for bit the logits of a cold read for llama, qwen2,
qwen3, phi3, gemma2 (interleaved sliding window, swa_full on and off), mamba (recurrent) and lfm2
(hybrid), with F16, Q8_0 and Q4_0 K/V caches, batch sizes and thread counts that differ between
the writer and the reader, metadata overrides, LoRA adapters and control vectors, as long as flash
attention is off or the cache is quantized. The exception is below; it is declared for every model
with attention layers, although the hybrid lfm2 (one attention layer) was measured exact.
"""

from __future__ import annotations

import llama_cpp

__all__ = ["unsupported_reason"]

# ggml's CPU flash attention reads batches of at least this many tokens with a tiled kernel (F32
# queries, GEMM) and smaller ones with a vector kernel (F16 queries), when K and V are both F16 or
# both F32 (ggml-cpu/ops.cpp, GGML_FA_TILE_Q).
FLASH_ATTN_TILE_TOKENS = 64
_TILED_KV_TYPES = (llama_cpp.GGML_TYPE_F16, llama_cpp.GGML_TYPE_F32)

FLASH_ATTN_REASON = (
    "flash attention over an F16/F32 K/V cache: llama.cpp reads batches of fewer than "
    f"{FLASH_ATTN_TILE_TOKENS} tokens with another kernel, so a prompt read on from a snapshot "
    "differs from a cold read; snapshots are neither restored nor saved "
    "(turn flash attention off, or use a quantized K/V cache, to cache this model)"
)


def unsupported_reason(llm: llama_cpp.Llama) -> str | None:
    """Why a state restored into this Llama would not continue exactly as a cold read; None if it would."""
    params = llm.context_params
    model = llm.model
    has_attention = not llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)
    flash_attn = int(params.flash_attn_type) != int(llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    type_k, type_v = int(params.type_k), int(params.type_v)
    if has_attention and flash_attn and type_k == type_v and type_k in _TILED_KV_TYPES:
        return FLASH_ATTN_REASON
    return None
