"""Prompts with images, through llama.cpp's mtmd: checked image bytes, a projector that decodes them
into pixels with an identity, and prompts of text and images keyed so that the store folds each image
in at its position. Not yet wired into `CachedLlama` or the server (which still refuse images)."""

from __future__ import annotations

from snapcache.llama.media.image_check import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, ImageError, check_image
from snapcache.llama.media.media_prompt import IMAGE_KEY_BASE, MediaPrompt, PromptPiece, image_key_tokens
from snapcache.llama.media.projector import Image, Projector

__all__ = [
    "IMAGE_KEY_BASE",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "Image",
    "ImageError",
    "MediaPrompt",
    "Projector",
    "PromptPiece",
    "check_image",
    "image_key_tokens",
]
