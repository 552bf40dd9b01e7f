"""Prompts with images, through llama.cpp's mtmd: checked image bytes, a projector that decodes them
into pixels with an identity, prompts of text and images keyed so that the store folds each image in
at its position, and where their reads may stop. `CachedLlama` and `attach` use them with `mmproj=`
(`hook.media_chat`); the server does not yet (its dialects refuse images)."""

from __future__ import annotations

from snapcache.errors import ImageError
from snapcache.key import IMAGE_KEY_BASE
from snapcache.llama.media.chat_images import ChatImages, has_images, split_images
from snapcache.llama.media.image_check import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, check_image
from snapcache.llama.media.media_grid import MediaGrid
from snapcache.llama.media.media_prompt import MediaPrompt, PromptPiece, image_key_tokens
from snapcache.llama.media.projector import Image, Projector

__all__ = [
    "IMAGE_KEY_BASE",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "ChatImages",
    "Image",
    "ImageError",
    "MediaGrid",
    "MediaPrompt",
    "Projector",
    "PromptPiece",
    "check_image",
    "has_images",
    "image_key_tokens",
    "split_images",
]
