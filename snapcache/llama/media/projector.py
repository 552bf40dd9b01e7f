"""A model's multimodal projector (an mmproj GGUF) loaded through llama.cpp's mtmd, and the images it decodes.

An image's identity is a hash of its decoded pixels and their dimensions, not of the bytes it came
in: the same screenshot sent as PNG once and as BMP the next time is one image, and a re-encoded
JPEG that decodes to other pixels is another. The projector's file fingerprint (`fingerprint`) goes
into every image's key tokens (`media_prompt`), since its weights make the image's embeddings; the
text before a prompt's first image keys as without a projector.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import blake3
import llama_cpp
from llama_cpp import mtmd_cpp

from snapcache.errors import ModelError
from snapcache.llama.exactness.model_files import file_fingerprint
from snapcache.llama.media.image_check import ImageError, check_image
from snapcache.llama.setup.loader import check_gguf_file

__all__ = ["Image", "Projector"]

# An image identity's length in bytes (BLAKE3, 256 bits, as llama-server's SHA-256 of an image's
# pixels): its hex is the mtmd bitmap's id.
IMAGE_ID_BYTES = 32


@dataclass(frozen=True, eq=False)  # no slots: a weak reference frees its bitmap
class Image:
    """An image decoded by a `Projector`: `id`, the hex hash of its pixels (`width` x `height`,
    RGB). It holds the mtmd bitmap until the image is collected."""

    id: str
    width: int
    height: int
    bitmap: Any = field(repr=False)


class Projector:
    """The projector at `path` for the text model of `llm`, loaded through mtmd (`n_threads`: the
    encoder's threads, by default the Llama's). ModelError where the file is not a projector mtmd
    loads, has no vision encoder, or does not fit the model (another embedding width). Close it
    (or use it as a context manager) before the Llama."""

    def __init__(
        self, llm: llama_cpp.Llama, path: str | os.PathLike[str], *, n_threads: int | None = None
    ) -> None:
        self.path = check_gguf_file(path)
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = int(llm.model_params.n_gpu_layers) != 0
        params.n_threads = int(n_threads or llm.n_threads)
        params.print_timings = False
        params.warmup = False
        self._ctx = mtmd_cpp.mtmd_init_from_file(str(self.path).encode(), llm.model, params)
        if not self._ctx:
            raise ModelError(
                f"{self.path} is not a projector that llama.cpp's mtmd loads for this model"
                " (another embedding width, or not an mmproj file: see llama.cpp's log)"
            )
        if not mtmd_cpp.mtmd_support_vision(self._ctx):
            mtmd_cpp.mtmd_free(self._ctx)
            raise ModelError(f"{self.path} has no vision encoder")
        if mtmd_cpp.mtmd_decode_use_mrope(self._ctx):
            # Positions that are not one per token (Qwen2-VL's M-RoPE) are not cached yet.
            mtmd_cpp.mtmd_free(self._ctx)
            raise ModelError(f"{self.path} places image tokens with M-RoPE, which snapcache does not cache")
        self.fingerprint = file_fingerprint(self.path)
        self._free = weakref.finalize(self, mtmd_cpp.mtmd_free, self._ctx)

    @property
    def ctx(self) -> Any:
        """The mtmd context (valid until `close`)."""
        if not self._ctx:
            raise ModelError("the projector is closed")
        return self._ctx

    def decode(self, data: bytes) -> Image:
        """The image in `data` (PNG, JPEG, GIF or BMP), checked (`check_image`), then decoded by
        mtmd; ImageError where it is not one or does not decode."""
        checked = check_image(data)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd_cpp.mtmd_helper_bitmap_init_from_buf(self.ctx, buffer, len(data), False)
        if not bitmap:
            raise ImageError(f"the {checked.format.upper()} image could not be decoded (damaged data)")
        width = int(mtmd_cpp.mtmd_bitmap_get_nx(bitmap))
        height = int(mtmd_cpp.mtmd_bitmap_get_ny(bitmap))
        n_bytes = int(mtmd_cpp.mtmd_bitmap_get_n_bytes(bitmap))
        pixels = ctypes.string_at(mtmd_cpp.mtmd_bitmap_get_data(bitmap), n_bytes)
        hasher = blake3.blake3(width.to_bytes(4, "little") + height.to_bytes(4, "little"))
        image_id = hasher.update(pixels).hexdigest(IMAGE_ID_BYTES)
        mtmd_cpp.mtmd_bitmap_set_id(bitmap, image_id.encode())
        image = Image(image_id, width, height, bitmap)
        weakref.finalize(image, mtmd_cpp.mtmd_bitmap_free, bitmap)
        return image

    def close(self) -> None:
        """Free the mtmd context (also done when the projector is collected)."""
        if self._ctx:
            self._ctx = None
            self._free()

    def __enter__(self) -> Projector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
