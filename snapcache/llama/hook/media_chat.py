"""Chat completions with images, cached: the Llama's own chat handler renders the chat, mtmd reads
the images, and the hook restores and saves the prompt by its key tokens.

The images are taken out of the messages (`chat_images`), each replaced by a marker the template
renders as text. When the handler tokenizes the rendered prompt (or hands it to `create_completion`
as text), the text is split at the markers into a `MediaPrompt` of text and decoded images, and the
handler gets its placeholder tokens instead. The hook's completion then restores the longest stored
prefix of the key tokens, reads the rest with the images through mtmd, and lets generation read the
last batch of text (`CompletionCache.prepare`). Whatever the handler does around the completion
(stop words, the chat response's shape) stays its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import llama_cpp

from snapcache.errors import ImageError, InvalidArgument
from snapcache.llama.media.chat_images import ChatImages, split_images
from snapcache.llama.media.media_prompt import MediaPrompt
from snapcache.llama.media.projector import Image, Projector
from snapcache.llama.templates.chat_prefix import patched

__all__ = ["MediaChat"]


class MediaChat:
    """Runs one chat completion with images of `llm` (see the module docstring)."""

    def __init__(self, llm: llama_cpp.Llama, projector: Projector) -> None:
        self._llm = llm
        self._projector = projector
        self._chat: ChatImages | None = None
        self._images: list[Image] = []
        self.pending: MediaPrompt | None = None  # made from the rendered prompt, for its completion

    @contextmanager
    def rendering(self, messages: Sequence[Mapping[str, Any]]) -> Iterator[list[dict[str, Any]]]:
        """While the block runs the chat handler on the messages it is given (the images replaced by
        markers), its tokenizing of the rendered prompt makes `pending`. ImageError or
        InvalidArgument, naming the part, for an image that is not one."""
        chat = split_images(messages)
        self._images = [self._decoded(data, k) for k, data in enumerate(chat.images)]
        self._chat = chat
        self.pending = None
        llm = self._llm
        marker = chat.marker.encode()

        def tokenize(text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
            if isinstance(text, bytes) and marker in text:
                return self.prompt_of(text.decode("utf-8"), add_bos=add_bos).placeholder_tokens
            return list(type(llm).tokenize(llm, text, add_bos, special))

        try:
            with patched(llm, "tokenize", tokenize):
                yield chat.messages
        finally:
            self._chat = None
            self._images = []

    def text_prompt(self, prompt: Any) -> Any:
        """A prompt the handler hands to `create_completion` as text with the markers in it: its
        placeholder tokens (making `pending`); any other prompt as it is."""
        chat = self._chat
        if chat is not None and isinstance(prompt, str) and chat.marker in prompt:
            return self.prompt_of(prompt, add_bos=True).placeholder_tokens
        return prompt

    def _decoded(self, data: bytes, image: int) -> Image:
        try:
            return self._projector.decode(data)
        except ImageError as exc:
            raise ImageError(f"the chat's image {image + 1}: {exc}", image=image) from None

    @property
    def rendering_images(self) -> bool:
        """Whether a chat with images is being rendered (`rendering` runs)."""
        return self._chat is not None

    def take(self) -> MediaPrompt | None:
        """The prompt with images the next completion reads (None: not one), once."""
        pending, self.pending = self.pending, None
        return pending

    def prompt_of(self, text: str, *, add_bos: bool) -> MediaPrompt:
        chat = self._chat
        assert chat is not None
        pieces = text.split(chat.marker)
        if len(pieces) - 1 != len(self._images):
            raise InvalidArgument(
                f"the chat template rendered {len(pieces) - 1} of the messages' {len(self._images)} images"
            )
        parts: list[str | Image] = [pieces[0]]
        for image, after in zip(self._images, pieces[1:], strict=True):
            parts += [image, after]
        prompt = MediaPrompt(self._projector, [part for part in parts if part != ""], add_special=add_bos)
        if prompt.pieces[-1].image_id is not None:
            raise InvalidArgument("a prompt with images must end with text after its last image")
        self.pending = prompt
        return prompt
