"""How many tokens a chat request's prompt has, rendered as the model will render it, without running it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from snapcache.errors import ImageError
from snapcache.llama.hook.media_chat import MediaChat
from snapcache.llama.media.projector import Projector
from snapcache.llama.templates.chat_prefix import ChatPrefixFinder
from snapcache.server.chat.chat_request import ChatRequest
from snapcache.server.chat.sent_images import ImageParts, named_image_problem
from snapcache.server.error_answers import BadRequest

__all__ = ["PromptCounter"]


class _Renderer:
    """The Llama to its chat handler, with its own attributes for the finder to shadow: rendering
    never touches the Llama that completions run on."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        # The finder calls `type(llm).tokenize(llm, ...)` for text that is not the prompt.
        return list(self._llm.tokenize(text, add_bos, special))


class _Renders(Protocol):
    """What the counter reads of the chat engine: its Llama, and a request as the model gets it."""

    llm: Any

    def prepared(self, request: ChatRequest, *, remember: bool = True) -> ChatRequest: ...

    def model_messages(self, request: ChatRequest) -> ImageParts: ...

    @property
    def projector(self) -> Projector | None: ...

    def template_options(self, request: ChatRequest) -> dict[str, Any]: ...


class PromptCounter:
    """Counts prompt tokens of chat requests on the engine's model."""

    def __init__(self, engine: _Renders) -> None:
        self._engine = engine
        llm: Any = engine.llm
        renderer = _Renderer(llm)

        def render(messages: list[Mapping[str, Any]], options: dict[str, Any]) -> Any:
            return type(llm).create_chat_completion(renderer, messages=messages, **options)

        self._renderer = renderer
        self._finder = ChatPrefixFinder(renderer, render)  # type: ignore[arg-type]
        self._lock = threading.Lock()  # the finder shadows the renderer's attributes while it renders

    def count(self, request: ChatRequest) -> int:
        """The prompt tokens of `request` (prompt rules applied, tools rendered)."""
        request = self._engine.prepared(request, remember=False)
        with_images = self._engine.model_messages(request)
        messages: list[Mapping[str, Any]] = list(with_images.messages)
        options = self._engine.template_options(request)
        projector = self._engine.projector
        with self._lock:
            if projector is None or not with_images.order:
                tokens = self._finder.render(messages, options)
            else:  # the images' tokens counted as mtmd reads them, their pixels decoded
                try:
                    with MediaChat(self._renderer, projector).rendering(messages) as plain:  # type: ignore[arg-type]
                        tokens = self._finder.render(list[Mapping[str, Any]](plain), options)
                except ImageError as exc:
                    raise named_image_problem(exc, with_images.order) from None
        if tokens is None:
            raise BadRequest("the model's chat template cannot render these messages", param="messages")
        return len(tokens)
