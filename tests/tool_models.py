"""Tiny GGUF models whose vocabulary holds a chat template's special tokens, for tool-call tests.

`write_template_model(path, template, specials, eos)` writes the tiny llama of `tiny_model` (2 layers,
64 wide, random weights from a seed) with the byte vocabulary plus `specials`, each one token of the
type a real GGUF gives it: control tokens (`[TOOL_CALLS]`, `<|im_end|>`: detokenized to nothing
unless special tokens are asked for) or user-defined ones (Qwen's `<tool_call>`: always shown), and
`template` as its `tokenizer.chat_template`. Text is tokenized byte by byte, the special tokens whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
from tiny_model import N_CTX_TRAIN, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_LAYERS

CONTROL = 3
USER_DEFINED = 4
_UNKNOWN, _BYTE = 2, 6

# The special tokens of the templates the tool tests use, typed as in the models' own GGUFs.
QWEN_SPECIALS = {
    "<|im_start|>": CONTROL,
    "<|im_end|>": CONTROL,
    "<tool_call>": USER_DEFINED,
    "</tool_call>": USER_DEFINED,
}
MISTRAL_SPECIALS = {
    "[INST]": CONTROL,
    "[/INST]": CONTROL,
    "[AVAILABLE_TOOLS]": CONTROL,
    "[/AVAILABLE_TOOLS]": CONTROL,
    "[TOOL_RESULTS]": CONTROL,
    "[/TOOL_RESULTS]": CONTROL,
    "[TOOL_CALLS]": CONTROL,
}


def write_template_model(
    path: str | Path,
    template: str,
    specials: Mapping[str, int],
    eos: str = "</s>",
    seed: int = 0,
    *,
    ascii_text: bool = False,
) -> Path:
    """Write the model (see the module docstring); `eos` is the text of its end-of-turn token (one of
    `specials`, or `</s>`); `ascii_text` as in `tiny_model.write_tiny_model`. Returns the path."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(specials)
    high = CONTROL if ascii_text else _BYTE  # see tiny_model._vocabulary
    types = [_UNKNOWN, CONTROL, CONTROL] + [_BYTE] * 128 + [high] * 128 + list(specials.values())
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    head_dim = N_EMBD // N_HEAD
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32))
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_k.weight", matrix(head_dim * N_HEAD_KV, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_v.weight", matrix(head_dim * N_HEAD_KV, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_output.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_up.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_down.weight", matrix(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", matrix(n_vocab, N_EMBD) * 4.0)
    writer.add_name(f"tiny-template-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(tokens.index(eos))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
