"""Write a tiny llama-architecture GGUF model (random weights, byte vocabulary) for fast real-model tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_LAYERS = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_CTX_TRAIN = 4096

# A small chat template so chat completions work on the tiny model.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_UNK, _BOS, _EOS = 0, 1, 2
_TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_BYTE = 2, 3, 6


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0] * len(tokens)
    types = [_TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_CONTROL] + [_TYPE_BYTE] * 256
    return tokens, scores, types


def write_tiny_llama(path: str | Path, seed: int = 0) -> Path:
    """Write a 2-layer, 64-wide llama GGUF with random weights from `seed` to `path`; return the path."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocabulary()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV

    def weight(rows: int, cols: int) -> np.ndarray:
        # Scaled by fan-in, so that the logits depend on the context and greedy decoding varies.
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny-llama-seed{seed}")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(_UNK)
    writer.add_bos_token_id(_BOS)
    writer.add_eos_token_id(_EOS)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32))
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(n_embd_kv, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(n_embd_kv, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD) * 4.0)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
