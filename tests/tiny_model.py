"""Write tiny GGUF models (random weights, fixed seed, byte vocabulary) for fast real-model tests.

`write_tiny_model(path, arch)` writes one of `ARCHITECTURES`, each a few layers and a few dozen
channels wide, laid out the way llama.cpp's loader expects that architecture:

- llama: the 2-layer, 64-wide model every test uses (`write_tiny_llama`); grouped-query attention;
- qwen2: Q/K/V biases; qwen3: per-head Q and K norms; both one K/V head for four query heads;
- phi3: one fused QKV matrix and a fused gate+up matrix;
- gemma2: interleaved sliding-window attention (a window of `GEMMA2_WINDOW` tokens on every other
  layer), logit soft-capping, norms after attention and feed-forward;
- mamba: a recurrent state-space model (no attention, no KV cache);
- lfm2: a hybrid, short-convolution layers (recurrent state) around an attention layer (KV cache).

`write_geometry_model` writes a llama with the KV geometry of a larger model (by default an 8B
model's: 32 layers, 8 K/V heads of 128 values, 128 KiB of f16 KV per token) around narrow hidden and
feed-forward layers, so that states have a real model's size while a prompt still reads in seconds.
`write_tiny_llama_with_vocabulary` gives the tiny llama a real model's vocabulary.
`write_tiny_lora` writes a LoRA adapter for a tiny model, `control_vector` a control vector's data.
`write_tiny_vision_model` writes the tiny llama with a projector (an mmproj GGUF) that llama.cpp's
mtmd loads: a 2-layer ViT and LLaVA's two-layer MLP, an image of `VISION_IMAGE_SIZE` pixels a side in
`VISION_IMAGE_TOKENS` embeddings, encoded in a few milliseconds.
Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

N_LAYERS = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_CTX_TRAIN = 4096

# Architectures other than llama use 32-wide heads: a quantized V cache needs head sizes that are a
# multiple of its 32-value blocks.
HEAD_DIM = 32
GEMMA2_WINDOW = 48
MAMBA_D_STATE = 8
MAMBA_D_CONV = 4
MAMBA_DT_RANK = 4

# The tiny projector: images resized to 64 x 64, in 8 x 8 patches: 64 embeddings an image.
VISION_IMAGE_SIZE = 64
VISION_PATCH = 8
VISION_IMAGE_TOKENS = (VISION_IMAGE_SIZE // VISION_PATCH) ** 2
VISION_EMBD = 32

LFM2_LAYERS = ("conv", "attention", "conv")
LFM2_CONV_CACHE = 3

ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "mamba", "lfm2")

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

Array = npt.NDArray[np.float32]


def _vocabulary(ascii_text: bool = False) -> tuple[list[str], list[float], list[int]]:
    """The byte vocabulary; `ascii_text`: the bytes above 0x7F are control tokens (text without
    special tokens leaves them out), so that a reply is never an unfinished UTF-8 character, which
    llama-cpp-python reads on to finish, past max_tokens, up to the end of the context."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0] * len(tokens)
    high = _TYPE_CONTROL if ascii_text else _TYPE_BYTE
    types = [_TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_CONTROL] + [_TYPE_BYTE] * 128 + [high] * 128
    return tokens, scores, types


N_VOCAB = len(_vocabulary()[0])


class _Weights:
    """Random matrices from one seed, scaled by fan-in so that the logits depend on the context."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def matrix(self, rows: int, cols: int) -> Array:
        return (self.rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vector(self, n: int, scale: float = 0.1) -> Array:
        return (self.rng.standard_normal(n) * scale).astype(np.float32)

    def embedding(self, n_embd: int) -> Array:
        return self.rng.standard_normal((N_VOCAB, n_embd)).astype(np.float32)


def write_tiny_llama(
    path: str | Path, seed: int = 0, n_ff: int = N_FF, n_ctx_train: int = N_CTX_TRAIN
) -> Path:
    """Write a 2-layer, 64-wide llama GGUF with random weights from `seed` to `path`; return the path.

    A larger `n_ff` makes a bigger file of the same shape otherwise (n_ff=8192: about 13 MB);
    `n_ctx_train` is the context length the model says it was trained for.
    """
    return write_tiny_model(path, "llama", seed, n_ff=n_ff, n_ctx_train=n_ctx_train)


def write_tiny_model(
    path: str | Path,
    arch: str = "llama",
    seed: int = 0,
    *,
    split_max_tensors: int = 0,
    n_ff: int = N_FF,
    n_ctx_train: int = N_CTX_TRAIN,
    ascii_text: bool = False,
) -> Path:
    """Write a tiny model of architecture `arch` (one of ARCHITECTURES) to `path`; return the path.

    `split_max_tensors` > 0 writes a split model instead, at most that many tensors a shard, in
    files named as llama.cpp expects them (NAME-00001-of-0000N.gguf); the first shard's path is
    returned. `n_ff` and `n_ctx_train` apply to llama only. `ascii_text`: replies are ASCII text
    (see `_vocabulary`), for tests that cannot pass a logit bias (the Messages and Responses APIs).
    """
    if arch not in _WRITERS:
        raise ValueError(f"no tiny writer for architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    if arch == "llama":
        _write_llama(writer, _Weights(seed), n_ff, n_ctx_train)
    else:
        _WRITERS[arch](writer, _Weights(seed))
    # llama.cpp patches the vocabulary of models whose name says "phi3": keep the names neutral.
    writer.add_name(f"tiny-{arch.replace('phi3', 'phi-three')}-seed{seed}")
    _add_vocabulary(writer, ascii_text=ascii_text)
    shards = writer.format_shard_names(path) if len(writer.tensors) > 1 else [path]
    _finish(writer)
    return shards[0]


def write_tiny_vision_model(
    directory: str | Path, seed: int = 0, image_size: int = VISION_IMAGE_SIZE
) -> tuple[Path, Path]:
    """Write the tiny llama and a projector for it into `directory`; return (model path, mmproj path).

    The projector is LLaVA 1.5's kind ("mlp"): patch embeddings, a 2-layer ViT, then a two-layer MLP
    to the llama's 64-wide embeddings, random weights from `seed`. An image is resized to
    `image_size` pixels a side: (image_size / 8) ** 2 embeddings (128: 256, as Gemma 3's).
    """
    directory = Path(directory)
    model = write_tiny_llama(directory / f"tiny-vision-llama-{seed}.gguf", seed=seed)
    mmproj = directory / f"tiny-vision-mmproj-{seed}-{image_size}.gguf"
    n_positions = (image_size // VISION_PATCH) ** 2
    w = _Weights(seed + 1000)
    n_embd, n_ff, n_layers = VISION_EMBD, 2 * VISION_EMBD, 2
    writer = gguf.GGUFWriter(str(mmproj), "clip")
    writer.add_name(f"tiny-vision-mmproj-seed{seed}")
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    for key, value in (
        ("image_size", image_size),
        ("patch_size", VISION_PATCH),
        ("embedding_length", n_embd),
        ("feed_forward_length", n_ff),
        ("block_count", n_layers),
        ("projection_dim", N_EMBD),
        ("attention.head_count", 2),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    patch = w.rng.standard_normal((n_embd, 3, VISION_PATCH, VISION_PATCH)) * 0.05
    writer.add_tensor("v.patch_embd.weight", patch.astype(np.float16))
    writer.add_tensor("v.patch_embd.bias", w.vector(n_embd))
    writer.add_tensor("v.position_embd.weight", w.matrix(n_positions, n_embd))
    writer.add_tensor("v.pre_ln.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("v.pre_ln.bias", w.vector(n_embd))
    for layer in range(n_layers):
        prefix = f"v.blk.{layer}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(prefix + name + ".weight", w.matrix(n_embd, n_embd))
            writer.add_tensor(prefix + name + ".bias", w.vector(n_embd))
        for name in ("ln1", "ln2"):
            writer.add_tensor(prefix + name + ".weight", np.ones(n_embd, dtype=np.float32))
            writer.add_tensor(prefix + name + ".bias", w.vector(n_embd))
        writer.add_tensor(prefix + "ffn_up.weight", w.matrix(n_ff, n_embd))
        writer.add_tensor(prefix + "ffn_up.bias", w.vector(n_ff))
        writer.add_tensor(prefix + "ffn_down.weight", w.matrix(n_embd, n_ff))
        writer.add_tensor(prefix + "ffn_down.bias", w.vector(n_embd))
    # Embeddings about as large as the llama's token embeddings, so that an image moves the reply.
    writer.add_tensor("mm.0.weight", w.matrix(N_EMBD, n_embd))
    writer.add_tensor("mm.0.bias", w.vector(N_EMBD))
    writer.add_tensor("mm.2.weight", w.matrix(N_EMBD, N_EMBD) * 4.0)
    writer.add_tensor("mm.2.bias", w.vector(N_EMBD))
    _finish(writer)
    return model, mmproj


def write_tiny_llama_with_vocabulary(
    path: str | Path, vocabulary_of: str | Path, seed: int = 0, n_ctx_train: int = 32768
) -> Path:
    """The tiny llama with the vocabulary (tokens, scores, types, BOS/EOS/unknown ids) of the model
    at `vocabulary_of`, its 16-bit embedding tied to its output: a model that reads the same tokens
    as a real one (an agent's 20K-token prompt) at the tiny model's speed."""
    tokens, scores, token_types, bos, eos, unknown = _vocabulary_of(Path(vocabulary_of))
    w = _Weights(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    _add_attention_hparams(writer, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_EMBD // N_HEAD, n_ctx_train)
    writer.add_tensor("token_embd.weight", w.rng.standard_normal((len(tokens), N_EMBD)).astype(np.float16))
    _add_llama_layers(writer, w, N_FF)
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_name(f"tiny-llama-large-vocabulary-seed{seed}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_unk_token_id(unknown)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    _finish(writer)
    return Path(path)


def _vocabulary_of(path: Path) -> tuple[list[bytes], list[float], list[int], int, int, int]:
    """Tokens, scores, GGUF token types and the BOS, EOS and unknown ids of the model at `path`."""
    import llama_cpp

    # llama_vocab_get_attr's flags, by the GGUF token type each stands for
    types = {1: 2, 2: 5, 4: 1, 8: 3, 16: 4, 32: 6}
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not read the vocabulary of {path}")
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        ids = range(llama_cpp.llama_vocab_n_tokens(vocab))
        tokens = [llama_cpp.llama_vocab_get_text(vocab, i) for i in ids]
        scores = [llama_cpp.llama_vocab_get_score(vocab, i) for i in ids]
        attrs = [llama_cpp.llama_vocab_get_attr(vocab, i) for i in ids]
        token_types = [next((t for bit, t in types.items() if attr & bit), 1) for attr in attrs]
        bos, eos = llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab)
        return tokens, scores, token_types, bos, eos, tokens.index(b"<unk>")
    finally:
        llama_cpp.llama_model_free(model)


def write_geometry_model(
    path: str | Path,
    n_layers: int = 32,
    n_head_kv: int = 8,
    head_dim: int = 128,
    seed: int = 0,
    *,
    n_embd: int = 256,
    n_head: int = 8,
    n_ff: int = 512,
    layers_alike: bool = False,
) -> Path:
    """Write a llama whose KV cache has `n_layers` x `n_head_kv` heads of `head_dim` values; return the path.

    The defaults give an 8B model's KV geometry (32 * 2 * 8 * 128 * 2 bytes = 128 KiB of f16 KV per
    token) with an `n_embd`-wide residual stream and `n_ff`-wide feed-forward layers; the matrices
    are f16 (about 90 MB). Heads are wider than n_embd / n_head, so the key and value lengths are
    written out. `layers_alike`: every layer gets the same random matrices, drawn once per shape,
    so that a model of a full 8B compute shape (14 GB) is written at the disk's speed.
    """
    if n_head % n_head_kv:
        raise ValueError(f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})")
    path = Path(path)
    w = _Weights(seed)
    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)

    drawn: dict[tuple[int, int], npt.NDArray[np.float16]] = {}

    def f16(matrix: Array) -> npt.NDArray[np.float16]:
        return matrix.astype(np.float16)

    def layer_matrix(rows: int, cols: int) -> npt.NDArray[np.float16]:
        if not layers_alike:
            return f16(w.matrix(rows, cols))
        if (rows, cols) not in drawn:
            drawn[rows, cols] = f16(w.matrix(rows, cols))
        return drawn[rows, cols]

    writer.add_tensor("token_embd.weight", f16(w.embedding(n_embd)))
    for layer in range(n_layers):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", layer_matrix(n_q, n_embd))
        writer.add_tensor(f"{prefix}.attn_k.weight", layer_matrix(n_kv, n_embd))
        writer.add_tensor(f"{prefix}.attn_v.weight", layer_matrix(n_kv, n_embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", layer_matrix(n_embd, n_q))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", layer_matrix(n_ff, n_embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", layer_matrix(n_ff, n_embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", layer_matrix(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", f16(w.matrix(N_VOCAB, n_embd) * 4.0))
    writer.add_name(f"geometry-llama-{n_layers}x{n_head_kv}x{head_dim}-seed{seed}")
    _add_vocabulary(writer, gguf.LlamaFileType.MOSTLY_F16)
    _finish(writer)
    return path


def write_tiny_lora(path: str | Path, arch: str = "llama", seed: int = 0, rank: int = 4) -> Path:
    """Write a LoRA adapter on the attention output and Q projections of a tiny `arch` model."""
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"no tiny LoRA writer for architecture {arch!r}")
    n_embd, n_head = (N_EMBD, N_HEAD) if arch == "llama" else (_ATTN_EMBD, _ATTN_HEADS)
    n_q = n_embd if arch == "llama" else n_head * HEAD_DIM
    rng = np.random.default_rng(seed)
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    for layer in range(N_LAYERS):
        for name, n_in, n_out in (("attn_q", n_embd, n_q), ("attn_output", n_q, n_embd)):
            # lora_a is {n_in, rank} and lora_b {rank, n_out} in ggml's order (numpy: reversed).
            a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            b = (rng.standard_normal((n_out, rank)) / np.sqrt(rank)).astype(np.float32)
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a)
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_b", b)
    _finish(writer)
    return path


def control_vector(n_embd: int, n_layers: int = N_LAYERS, seed: int = 0, scale: float = 0.5) -> Array:
    """Data for `llama_set_adapter_cvec`: one row of n_embd values per layer, from layer 1 on."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n_layers, n_embd)) * scale).astype(np.float32)


# -- per-architecture tensors and metadata --------------------------------------------------------

_ATTN_EMBD = 128
_ATTN_HEADS = 4
_ATTN_HEADS_KV = 1
_ATTN_FF = 192


def _write_llama(
    writer: gguf.GGUFWriter, w: _Weights, n_ff: int = N_FF, n_ctx_train: int = N_CTX_TRAIN
) -> None:
    _add_attention_hparams(writer, N_EMBD, N_HEAD, N_HEAD_KV, n_ff, N_EMBD // N_HEAD, n_ctx_train)
    writer.add_tensor("token_embd.weight", w.embedding(N_EMBD))
    _add_llama_layers(writer, w, n_ff)
    _add_output(writer, w, N_EMBD)


def _add_llama_layers(writer: gguf.GGUFWriter, w: _Weights, n_ff: int) -> None:
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", w.matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_k.weight", w.matrix(n_embd_kv, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_v.weight", w.matrix(n_embd_kv, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_output.weight", w.matrix(N_EMBD, N_EMBD))
        _add_gated_ffn(writer, w, prefix, N_EMBD, n_ff)


def _write_qwen(writer: gguf.GGUFWriter, w: _Weights, *, biases: bool, head_norms: bool) -> None:
    n_embd, n_q, n_kv = _ATTN_EMBD, _ATTN_HEADS * HEAD_DIM, _ATTN_HEADS_KV * HEAD_DIM
    _add_attention_hparams(writer, n_embd, _ATTN_HEADS, _ATTN_HEADS_KV, _ATTN_FF, HEAD_DIM)
    writer.add_tensor("token_embd.weight", w.embedding(n_embd))
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name, rows in (("attn_q", n_q), ("attn_k", n_kv), ("attn_v", n_kv)):
            writer.add_tensor(f"{prefix}.{name}.weight", w.matrix(rows, n_embd))
            if biases:
                writer.add_tensor(f"{prefix}.{name}.bias", w.vector(rows))
        if head_norms:
            writer.add_tensor(f"{prefix}.attn_q_norm.weight", 1.0 + w.vector(HEAD_DIM))
            writer.add_tensor(f"{prefix}.attn_k_norm.weight", 1.0 + w.vector(HEAD_DIM))
        writer.add_tensor(f"{prefix}.attn_output.weight", w.matrix(n_embd, n_q))
        _add_gated_ffn(writer, w, prefix, n_embd, _ATTN_FF)
    _add_output(writer, w, n_embd)


def _write_phi3(writer: gguf.GGUFWriter, w: _Weights) -> None:
    n_embd, n_kv = _ATTN_EMBD, _ATTN_HEADS_KV * HEAD_DIM
    _add_attention_hparams(writer, n_embd, _ATTN_HEADS, _ATTN_HEADS_KV, _ATTN_FF, HEAD_DIM)
    writer.add_tensor("token_embd.weight", w.embedding(n_embd))
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_qkv.weight", w.matrix(n_embd + 2 * n_kv, n_embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", w.matrix(n_embd, n_embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_up.weight", w.matrix(2 * _ATTN_FF, n_embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", w.matrix(n_embd, _ATTN_FF))
    _add_output(writer, w, n_embd)


def _write_gemma2(writer: gguf.GGUFWriter, w: _Weights) -> None:
    n_embd, n_q, n_kv = _ATTN_EMBD, _ATTN_HEADS * HEAD_DIM, _ATTN_HEADS_KV * HEAD_DIM
    _add_attention_hparams(writer, n_embd, _ATTN_HEADS, _ATTN_HEADS_KV, _ATTN_FF, HEAD_DIM)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_sliding_window(GEMMA2_WINDOW)
    writer.add_attn_logit_softcapping(50.0)
    writer.add_final_logit_softcapping(30.0)
    # Gemma scales the embeddings by sqrt(n_embd) and ties the output to them: keep both small.
    writer.add_tensor("token_embd.weight", w.embedding(n_embd) / np.float32(np.sqrt(n_embd)))
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", w.matrix(n_q, n_embd))
        writer.add_tensor(f"{prefix}.attn_k.weight", w.matrix(n_kv, n_embd))
        writer.add_tensor(f"{prefix}.attn_v.weight", w.matrix(n_kv, n_embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", w.matrix(n_embd, n_q))
        writer.add_tensor(f"{prefix}.post_attention_norm.weight", np.full(n_embd, 3.0, dtype=np.float32))
        _add_gated_ffn(writer, w, prefix, n_embd, _ATTN_FF)
        writer.add_tensor(f"{prefix}.post_ffw_norm.weight", np.full(n_embd, 3.0, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.full(n_embd, 8.0, dtype=np.float32))


def _write_mamba(writer: gguf.GGUFWriter, w: _Weights) -> None:
    n_embd = N_EMBD
    d_inner = 2 * n_embd  # llama.cpp supports an expansion factor of 2 only
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_ssm_conv_kernel(MAMBA_D_CONV)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(MAMBA_D_STATE)
    writer.add_ssm_time_step_rank(MAMBA_DT_RANK)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tensor("token_embd.weight", w.embedding(n_embd))
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ssm_in.weight", w.matrix(2 * d_inner, n_embd))
        writer.add_tensor(f"{prefix}.ssm_conv1d.weight", w.matrix(d_inner, MAMBA_D_CONV))
        writer.add_tensor(f"{prefix}.ssm_conv1d.bias", w.vector(d_inner))
        writer.add_tensor(f"{prefix}.ssm_x.weight", w.matrix(MAMBA_DT_RANK + 2 * MAMBA_D_STATE, d_inner))
        writer.add_tensor(f"{prefix}.ssm_dt.weight", w.matrix(d_inner, MAMBA_DT_RANK))
        writer.add_tensor(f"{prefix}.ssm_dt.bias", w.vector(d_inner))
        # A = -exp(A_log): negative, so that the state decays.
        a = -np.tile(np.arange(1, MAMBA_D_STATE + 1, dtype=np.float32), (d_inner, 1))
        writer.add_tensor(f"{prefix}.ssm_a", a)
        writer.add_tensor(f"{prefix}.ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ssm_out.weight", w.matrix(n_embd, d_inner))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", w.matrix(N_VOCAB, n_embd) * 4.0)


def _write_lfm2(writer: gguf.GGUFWriter, w: _Weights) -> None:
    n_embd, n_kv = _ATTN_EMBD, _ATTN_HEADS_KV * HEAD_DIM
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(len(LFM2_LAYERS))
    writer.add_feed_forward_length(_ATTN_FF)
    writer.add_head_count(_ATTN_HEADS)
    # llama.cpp reads a layer without K/V heads as a convolution (recurrent) layer.
    writer.add_head_count_kv([_ATTN_HEADS_KV if kind == "attention" else 0 for kind in LFM2_LAYERS])
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_shortconv_l_cache(LFM2_CONV_CACHE)
    writer.add_tensor("token_embd.weight", w.embedding(n_embd))
    for layer, kind in enumerate(LFM2_LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        if kind == "attention":
            writer.add_tensor(f"{prefix}.attn_q_norm.weight", 1.0 + w.vector(HEAD_DIM))
            writer.add_tensor(f"{prefix}.attn_k_norm.weight", 1.0 + w.vector(HEAD_DIM))
            writer.add_tensor(f"{prefix}.attn_q.weight", w.matrix(n_embd, n_embd))
            writer.add_tensor(f"{prefix}.attn_k.weight", w.matrix(n_kv, n_embd))
            writer.add_tensor(f"{prefix}.attn_v.weight", w.matrix(n_kv, n_embd))
            writer.add_tensor(f"{prefix}.attn_output.weight", w.matrix(n_embd, n_embd))
        else:
            writer.add_tensor(f"{prefix}.shortconv.conv.weight", w.matrix(n_embd, LFM2_CONV_CACHE))
            writer.add_tensor(f"{prefix}.shortconv.in_proj.weight", w.matrix(3 * n_embd, n_embd))
            writer.add_tensor(f"{prefix}.shortconv.out_proj.weight", w.matrix(n_embd, n_embd))
        _add_gated_ffn(writer, w, prefix, n_embd, _ATTN_FF)
    writer.add_tensor("token_embd_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", w.matrix(N_VOCAB, n_embd) * 4.0)


_WRITERS: dict[str, Callable[[gguf.GGUFWriter, _Weights], None]] = {
    "llama": _write_llama,
    "qwen2": lambda writer, w: _write_qwen(writer, w, biases=True, head_norms=False),
    "qwen3": lambda writer, w: _write_qwen(writer, w, biases=False, head_norms=True),
    "phi3": _write_phi3,
    "gemma2": _write_gemma2,
    "mamba": _write_mamba,
    "lfm2": _write_lfm2,
}


def _add_attention_hparams(
    writer: gguf.GGUFWriter,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    head_dim: int,
    n_ctx_train: int = N_CTX_TRAIN,
) -> None:
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)


def _add_gated_ffn(writer: gguf.GGUFWriter, w: _Weights, prefix: str, n_embd: int, n_ff: int) -> None:
    writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor(f"{prefix}.ffn_gate.weight", w.matrix(n_ff, n_embd))
    writer.add_tensor(f"{prefix}.ffn_up.weight", w.matrix(n_ff, n_embd))
    writer.add_tensor(f"{prefix}.ffn_down.weight", w.matrix(n_embd, n_ff))


def _add_output(writer: gguf.GGUFWriter, w: _Weights, n_embd: int) -> None:
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", w.matrix(N_VOCAB, n_embd) * 4.0)


def _add_vocabulary(
    writer: gguf.GGUFWriter,
    file_type: gguf.LlamaFileType = gguf.LlamaFileType.ALL_F32,
    *,
    ascii_text: bool = False,
) -> None:
    tokens, scores, types = _vocabulary(ascii_text)
    writer.add_file_type(file_type)
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


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
