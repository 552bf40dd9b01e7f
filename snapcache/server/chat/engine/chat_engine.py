"""The one place a `ChatRequest` runs: rendered, restored, generated, parsed, reported.

Every dialect's request runs here, through the server's `ModelEngine` (`chat`), with its scope and
its `RequestRecord` as arguments, so every request restores and saves through the same path; the
engine writes into the record what the request restored. Its chat stream is read on worker threads.
Stop sequences are matched here, on the text, so the reply says which one ended
it; tools are rendered and their calls read by the request's `ToolChannel`: the model's own format
where its template has one (the answer then read with its special tokens as text, where call markers
such as `[TOOL_CALLS]` live), else the generic one. A call comes as `ToolCalled` once it is whole;
with `live_tool_calls`, `ToolCallDelta`s announce it first and carry its arguments as written, and
`ToolCallDropped` says an announced call was not made. A call the token limit cut short (the reply
ended inside it) is never given back as text: the answer ends with "length", and `ToolCallCut`
carries the call as far as it went (then a `ToolCallDropped` marked `cut`). A whole answer shows it
where its API leaves a partial call (Chat Completions' `tool_calls`, an `incomplete` Responses item);
a stream shows it only where live calls streamed it already, so that an agent run with a small
output cap ends its turn on the stop reason rather than run half a call. A call that turned out
malformed is given back as text where it stood.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Generator, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import anyio
from llama_cpp.llama_grammar import LlamaGrammar

from snapcache.errors import ImageError, InvalidArgument
from snapcache.llama.media.projector import Projector
from snapcache.server.chat.chat_request import ChatRequest
from snapcache.server.chat.engine.generic_tools import GenericTools
from snapcache.server.chat.engine.native_tools import NativeTools
from snapcache.server.chat.engine.prompt_rules import PromptRules
from snapcache.server.chat.engine.prompt_size import PromptCounter
from snapcache.server.chat.engine.tool_channel import ToolChannel
from snapcache.server.chat.events import (
    ChatEvent,
    Finished,
    Started,
    TextDelta,
    ToolCallCut,
    ToolCalled,
    Usage,
)
from snapcache.server.chat.sent_images import (
    ImageParts,
    SentImage,
    as_image_parts,
    named_image_problem,
    without_projector,
)
from snapcache.server.checks import ModelLimits, check_grammar, check_logit_bias
from snapcache.server.error_answers import BadRequest, client_error
from snapcache.server.model_engine import ModelEngine
from snapcache.server.request_record import RequestRecord
from snapcache.server.tools import StreamItem, ToolCall, ToolCallDelta, ToolCallDropped

__all__ = ["ChatEngine"]

T = TypeVar("T")
_TOO_LONG = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


class ChatEngine:
    """Runs chat requests on the served model (see the module docstring)."""

    def __init__(
        self,
        model: ModelEngine,
        rules: PromptRules,
        max_tokens_default: int | None,
        *,
        live_tool_calls: bool = False,
    ) -> None:
        self.model = model
        self.llm = model.llm  # its template, tokenizer and metadata, which the tool formats read
        self._rules = rules
        self._max_tokens_default = max_tokens_default
        self._live_tool_calls = live_tool_calls
        self.n_ctx = int(self.llm.n_ctx())
        self._limits = ModelLimits.of(self.llm)
        self._counter = PromptCounter(self)

    def prepared(self, request: ChatRequest, *, remember: bool = True) -> ChatRequest:
        """`request` with the prompt rules applied to its text (what they changed remembered for
        its scope unless told not to)."""
        matched: set[str] = set()
        messages = tuple(replace(m, content=self._rules.clean(m.content, matched)) for m in request.messages)
        if remember:
            self._rules.remember(request.scope, matched)
        return replace(request, messages=messages)

    def count_prompt_tokens(self, request: ChatRequest) -> int:
        """The prompt tokens of `request` as the model would read it (prompt rules applied, tools
        rendered), without running it; BadRequest where its template cannot render it."""
        return self._counter.count(request)

    def tool_channel(self, request: ChatRequest) -> ToolChannel:
        """How `request`'s tools go to the model and its calls come back: the model's own format where
        its template has one (held by a lazy grammar from its marker token on under `auto`, where
        requests are batched: the batched sampler takes one), else the generic one."""
        return tool_channel_for(request, self.llm, lazy_grammars=self.model.batched is not None)

    def rendered_messages(self, request: ChatRequest) -> list[dict[str, Any]]:
        """The messages the model's chat template gets for `request` (tools included)."""
        return self.tool_channel(request).messages(request)

    def template_options(self, request: ChatRequest) -> dict[str, Any]:
        """What the model's chat template gets for `request` besides the messages (the tools, where
        the template places them itself): `create_chat_completion`'s keyword arguments."""
        return self.tool_channel(request).options(request)

    @property
    def projector(self) -> Projector | None:
        """The model's projector, with which its chats read images (None: served without one)."""
        return self.model.projector

    def model_messages(self, request: ChatRequest) -> ImageParts:
        """The messages `create_chat_completion` gets for `request`: as rendered for the template,
        each image an OpenAI `image_url` part where its marker stands (see `sent_images`), and the
        images in the order they hold them."""
        return self._with_image_parts(request, self.rendered_messages(request))

    def _with_image_parts(self, request: ChatRequest, messages: list[dict[str, Any]]) -> ImageParts:
        """`messages`, rendered for `request`, with its images as parts (see `model_messages`);
        BadRequest, naming the field, for images sent to a model served without a projector."""
        if request.images and self.model.projector is None:
            raise without_projector(request.images[0])
        if not request.images:
            return ImageParts(messages, ())
        return as_image_parts(messages, request.image_marker, request.images)

    async def events(
        self, request: ChatRequest, record: RequestRecord | None = None
    ) -> AsyncIterator[ChatEvent]:
        """The request's events: `Started`, text and calls, `Finished`; BadRequest (before `Started`)
        for a request the model cannot run. Iterate it in one task, to its end or `aclose`.
        `record`: where the request's reuse is written (by `Started`, what it restored)."""
        request = self.prepared(request)
        tools = self.tool_channel(request)
        record = record if record is not None else RequestRecord(scope=request.scope)
        run = self._run(request, tools, record)
        try:
            while True:
                try:
                    event = await anyio.to_thread.run_sync(lambda: next(run, None))
                except Exception as exc:
                    raise self._problem(exc) from exc
                if event is None:
                    return
                yield event
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(run.close)

    def _run(
        self, request: ChatRequest, tools: ToolChannel, record: RequestRecord
    ) -> Generator[ChatEvent, None, None]:
        """The events of one request, on worker threads (one at a time)."""
        began = time.monotonic_ns()
        limit = request.max_tokens if request.max_tokens is not None else self._max_tokens_default
        kwargs: dict[str, Any] = {"stream": True, "max_tokens": limit, **tools.options(request)}
        kwargs.update(request.sampling.settings())
        kwargs.update(_constraints(self.model, request, tools, self._limits))
        if tools.stop(request):
            kwargs["stop"] = list(tools.stop(request))
        special_text = tools.special_text(request)
        with_images = self._with_image_parts(request, tools.messages(request))
        try:
            chunks = self.model.chat(with_images.messages, record, special_text=special_text, **kwargs)
        except ImageError as exc:
            raise named_image_problem(exc, with_images.order) from None
        stops = _StopMatcher(request.stop)
        reader = tools.reader(request)
        calls = _CallEvents(live=self._live_tool_calls)
        started, reason, generated, called = False, "end", 0, False
        try:
            for chunk in _naming_images(chunks, with_images.order):
                if not started:
                    started = True
                    yield Started(_usage(record, generated), time.monotonic_ns() - began)
                choice = chunk["choices"][0]
                piece = choice.get("delta", {}).get("content") or ""
                if piece:
                    generated += 1
                    ready, matched = stops.feed(piece)
                    items = reader.feed(ready) if ready else []
                    called = called or any(isinstance(item, ToolCall) for item in items)
                    yield from calls.events(items)
                    if matched is not None:
                        reason = "stop_sequence"
                        break
                    if reader.finished:
                        break  # the rest would be dropped: the request is cancelled here
                if choice.get("finish_reason") == "length":
                    reason = "length"
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # a stream ended at a stop sequence: its request is cancelled, its state kept
        if not started:
            yield Started(_usage(record, generated), time.monotonic_ns() - began)
        rest = stops.flush() if reason != "stop_sequence" else ""
        fed = reader.feed(rest) if rest else []
        held = reader.finish()
        if reason == "length":  # the token limit ended the reply inside what the reader still held
            held = [_cut(item) if isinstance(item, ToolCallDropped) else item for item in held]
        items = [*fed, *held]
        called = called or any(isinstance(item, ToolCall) for item in items)
        yield from calls.events(items)
        if called:
            reason = "tool_calls"
        elapsed = time.monotonic_ns() - began
        yield Finished(reason, _usage(record, generated), stops.matched, elapsed)  # type: ignore[arg-type]

    def _problem(self, exc: Exception) -> Exception:
        """The BadRequest a failure of the model's is, or the failure itself."""
        if isinstance(exc, BadRequest):
            return exc
        document = client_error(exc)
        if document is None and isinstance(exc, InvalidArgument):  # what the request asked of the model
            return BadRequest(str(exc), param="messages")
        if document is None:
            return exc
        error = document["error"]
        found = _TOO_LONG.search(str(exc))
        if found is not None:
            asked, held = found.groups()
            message = (
                f"the prompt does not fit the model's context: it needs {asked} tokens, the context "
                f"holds {held}; start snapcache serve with a larger --n-ctx"
            )
            return BadRequest(message, param=error.get("param"), code="context_length_exceeded")
        return BadRequest(error["message"], param=error.get("param"), code=error.get("code"))


def _constraints(
    model: ModelEngine, request: ChatRequest, tools: ToolChannel, limits: ModelLimits
) -> dict[str, Any]:
    """What holds the answer besides its sampling settings, as `create_chat_completion`'s keyword
    arguments: one grammar (the tools', the request's own, or its response format's), the logit
    bias by token id, and a minimum length; BadRequest for a grammar or a bias the model cannot take."""
    kwargs: dict[str, Any] = {}
    sampling = request.sampling
    check_logit_bias(sampling.logit_bias, sampling.logit_bias_type, limits)
    grammar = tools.grammar(request)
    if grammar is not None:
        kwargs["grammar"] = grammar
    elif request.grammar is not None:
        check_grammar(request.grammar, limits)
        kwargs["grammar"] = LlamaGrammar.from_string(request.grammar, verbose=False)
    elif request.response_format is not None:
        kwargs["response_format"] = dict(request.response_format)
    if sampling.logit_bias:
        kwargs["logit_bias"] = (
            model.bias_by_token(sampling.logit_bias)
            if sampling.logit_bias_type == "tokens"
            else {int(token): bias for token, bias in sampling.logit_bias.items()}
        )
    if request.min_tokens > 0:
        kwargs["logits_processor"] = model.min_tokens_processor(request.min_tokens)
    return kwargs


def _naming_images(chunks: Iterable[Any], order: tuple[SentImage, ...]) -> Iterator[Any]:
    """The chunks, an image the hook could not decode named by its field (see `named_image_problem`)."""
    try:
        yield from chunks
    except ImageError as exc:
        raise named_image_problem(exc, order) from None


def _cut(dropped: ToolCallDropped) -> ToolCallDropped:
    """A call the token limit ended the reply inside: cut short, its text not shown."""
    return replace(dropped, text="", cut=True)


class _CallEvents:
    """The events of what a reply's reader found. Unless calls are `live`, a call is given only once
    it is whole: its deltas are left out, and a call dropped malformed is its text, as text. A call
    `cut` short is a `ToolCallCut` (built from its deltas) and its `ToolCallDropped`, live or not."""

    def __init__(self, *, live: bool) -> None:
        self._live = live
        self._written: dict[str, ToolCall] = {}  # each call announced, as far as its deltas went

    def events(self, items: list[StreamItem]) -> Iterator[ChatEvent]:
        for item in items:
            if isinstance(item, str):
                yield TextDelta(item)
            elif isinstance(item, ToolCall):
                self._written.pop(item.id, None)
                yield ToolCalled(item)
            elif isinstance(item, ToolCallDelta):
                so_far = self._written.get(item.id, ToolCall(item.id, item.name, ""))
                self._written[item.id] = replace(so_far, arguments=so_far.arguments + item.arguments)
                if self._live:
                    yield item
            else:
                yield from self._dropped(item)

    def _dropped(self, dropped: ToolCallDropped) -> Iterator[ChatEvent]:
        written = self._written.pop(dropped.id, None)
        if dropped.cut and written is not None:
            yield ToolCallCut(written)
        if self._live or dropped.cut:
            yield dropped
        elif dropped.text:
            yield TextDelta(dropped.text)


def _usage(record: RequestRecord, generated: int) -> Usage:
    """The request's usage as its record has it (what the engine reported), so far."""
    if record.restore is None:
        return Usage(completion_tokens=generated)
    restore = record.restore
    completion = record.completion_tokens if record.completion_tokens is not None else generated
    return Usage(restore.prompt_tokens, restore.cached_tokens, completion)


class _StopMatcher:
    """Text as it comes, held back while it could be the start of a stop sequence."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None

    def feed(self, piece: str) -> tuple[str, str | None]:
        """The text that is safe to pass on, and the stop sequence that ended the text, if one did."""
        text = self._held + piece
        if not self._stops:
            return text, None
        found = [(text.find(s), s) for s in self._stops if s in text]
        if found:
            at, stop = min(found)
            self._held, self.matched = "", stop
            return text[:at], stop
        keep = max((_overlap(text, s) for s in self._stops), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def _overlap(text: str, stop: str) -> int:
    for i in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:i]):
            return i
    return 0


def tool_channel_for(request: ChatRequest, llm: Any, *, lazy_grammars: bool = False) -> ToolChannel:
    """The format for `request` on `llm` (the loaded `llama_cpp.Llama`): the model's own where its
    template renders tools, else the generic one; `lazy_grammars`: see `NativeTools.for_model`."""
    native = NativeTools.for_model(llm, lazy_grammars=lazy_grammars)
    return native if native is not None else GenericTools.for_model(llm)
