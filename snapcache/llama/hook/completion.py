"""One completion of a hooked Llama: its prefix restored before it reads the prompt, its states saved.

`CompletionCache.prepare` runs when llama-cpp-python hands the final prompt tokens to `generate`: the
longest stored prefix goes into the context (`prefix_loader`), and the restore points the prompt
should leave behind are planned (`PrefixCache.plan`, as the batched path plans them). On a model with
one cache they are all cut from one capture after the completion (`finish`); sliding-window and
recurrent models read on to each point first and save it there. A stored prompt end replaces the
conversation's previous one (`PrefixCache.supersede`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import llama_cpp

from snapcache.errors import ModelError
from snapcache.key import BLOCK_TOKENS, SnapshotKey, TokenArray
from snapcache.llama.exactness.readiness import Readiness
from snapcache.llama.hook.prefix_loader import PrefixLoader
from snapcache.llama.media.media_grid import MediaGrid
from snapcache.llama.media.media_prompt import MediaPrompt
from snapcache.llama.state.blocks import KIND_PROMPT_END
from snapcache.llama.state.sequences import truncate_sequence
from snapcache.llama.stored.checkpoints import RestorePoint, head_point
from snapcache.llama.stored.read_grid import ReadGrid
from snapcache.llama.stored.reports import CompletionListener, CompletionReport, RestoreInfo
from snapcache.llama.templates.chat_prefix import SharedPrefix
from snapcache.prompt_tokens import PromptTokens

__all__ = ["Completion", "CompletionCache", "LastPrompt"]

_log = logging.getLogger("snapcache")

_T = TypeVar("_T")

# Scopes whose last prompt `explain` can still look at, and whose last prompt end can be replaced.
_REMEMBERED_SCOPES = 64


@dataclass(slots=True)
class Completion:
    """One completion in flight: its scope, the checkpoints it asked for and what it has done so far."""

    scope: str
    chat_prefix: SharedPrefix | None
    ladder: bool
    prepared: bool = False
    saved_upto: int = 0  # the longest prefix of the context known to be stored or restored
    head: int = 0  # where the head its conversations share ends (`checkpoints.head_point`; 0: none)
    checkpoints: int = 0
    cacheable: bool = True  # False: llama.cpp would not continue a restored state exactly
    prompt: PromptTokens | None = None  # validated once: its hashes serve the lookups and the saves
    deferred: list[RestorePoint] = field(default_factory=list)  # cut from the capture after it
    restore: RestoreInfo | None = None
    generated: int = 0
    last_token: int | None = None
    read_seconds: float | None = None
    cancelled: bool = False  # its reader is gone: generation ends at the next token
    listener: CompletionListener | None = None  # told of this completion (None: the cache's listener)
    # A prompt with images (`hook.media_chat`): keyed, restored and read by its key tokens, the images
    # through mtmd; generation sees its placeholder tokens.
    media: MediaPrompt | None = None

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(frozen=True, slots=True)
class LastPrompt:
    """A scope's last prompt: its tokens, how many were restored, and when (`time.time()`)."""

    tokens: TokenArray
    restored: int
    prepared_at: float


class CompletionCache:
    """Restores before, and saves after, the completions of one Llama (see the module docstring), by
    the rules of its loader's `PrefixCache`. `listener` hears of every completion."""

    def __init__(
        self,
        llm: llama_cpp.Llama,
        loader: PrefixLoader,
        readiness: Readiness,
        *,
        listener: CompletionListener | None,
    ) -> None:
        self._llm = llm
        self._loader = loader
        self._cache = loader.cache
        self._readiness = readiness
        self._listener = listener
        self._last_prompts: OrderedDict[str, LastPrompt] = OrderedDict()
        self._last_prompt_end: OrderedDict[str, SnapshotKey] = OrderedDict()

    @property
    def saves(self) -> bool:
        """Whether completions save states (False: they only restore)."""
        return self._cache.saves

    @property
    def has_ladder(self) -> bool:
        """Whether raw prompts leave window points along them (see `PrefixCache`'s `prefix_reuse`)."""
        return bool(self._cache.ladder)

    def last_prompt(self, scope: str) -> LastPrompt | None:
        """The last prompt prepared in `scope`, if it is still remembered."""
        return self._last_prompts.get(scope)

    def prepare(self, prompt: Sequence[int], completion: Completion) -> None:
        """Load the longest cached prefix of `prompt` into the context, then read on to checkpoints."""
        llm = self._llm
        media = completion.media
        if media is not None and list(prompt) != media.placeholder_tokens:
            raise ModelError("the chat handler changed the tokens of a prompt with images; not read")
        hashed = PromptTokens.of(prompt if media is None else media.key_tokens)
        tokens = hashed.array
        n = len(tokens)
        if n == 0 or n >= int(llm.n_ctx()):
            return  # llama-cpp-python raises or handles these itself
        grid = self._readiness.grid if media is None else MediaGrid.over(self._readiness.grid, media)
        if media is not None and not completion.cacheable:
            truncate_sequence(llm, 0)  # generation reads no image: they are read here, from the start
        started = time.perf_counter()
        reused, source = (
            self._loader.load(hashed, completion.scope, grid) if completion.cacheable else (0, None)
        )
        restore_seconds = time.perf_counter() - started
        _remember(self._last_prompts, completion.scope, LastPrompt(tokens, reused, time.time()))
        completion.saved_upto = reused
        completion.prompt = hashed
        if self._cache.saves and completion.cacheable:
            self._read_to_checkpoints(completion, hashed, reused, grid)
        if media is not None or (completion.cacheable and grid.exact and int(llm.n_tokens) > 0):
            # The context holds a prefix of the prompt, and llama-cpp-python reads the rest from where
            # it stops, n_batch at a time: read on to the cold read's last batch here, so that the
            # rest is that batch (see `ReadGrid`). Its images are read here, whatever the cache does.
            _read_to(llm, tokens, grid.batch_start(n - 1), grid)
        if completion.cacheable:
            self._loader.mark_read(n)  # generate reads the rest of the prompt next
        evaluated = n - min(reused, n - 1)
        completion.restore = RestoreInfo(
            n, reused, evaluated, source, completion.checkpoints, restore_seconds
        )
        _log.debug("prompt of %d tokens: %d reused (%s), %d to evaluate", n, reused, source, evaluated)
        listener = self._listener_of(completion)
        if listener is not None:
            listener.restored(completion.scope, completion.restore)

    def _read_to_checkpoints(
        self, completion: Completion, prompt: PromptTokens, reused: int, grid: ReadGrid
    ) -> None:
        """Plan the restore points of `prompt`; on a model that cannot cut one capture into them, read
        on to each and save it there (the rest are saved by `finish`)."""
        llm = self._llm
        cache = self._cache
        tokens = prompt.array
        chat_prefix = completion.chat_prefix
        alignment = grid.alignment
        if chat_prefix is not None and chat_prefix.reached(tokens, reused, alignment):
            chat_prefix = None  # restored up to the end of the system part already
        shared = None if chat_prefix is None else chat_prefix.tokens()
        completion.head = head_point(tokens, shared, alignment, grid)
        plan = cache.plan(
            tokens, reused=reused, head=completion.head, raw=completion.ladder, alignment=alignment, grid=grid
        )
        for restore_point in plan:
            point = restore_point.n_tokens
            if cache.one_capture:
                completion.deferred.append(restore_point)
            else:
                _read_to(llm, tokens, point, grid)
                completion.checkpoints += self._loader.save(completion.scope, [restore_point], prompt=prompt)
                self._superseding(completion, restore_point, prompt)
            completion.saved_upto = point

    def finish(self, completion: Completion) -> None:
        """Save the context after a completion, keyed by the tokens it holds (never the last sampled one)."""
        if not completion.prepared:
            return
        if completion.media is not None:
            # Generation saw placeholders: the saves, and the next prompt, see the key tokens again.
            completion.media.write_tokens(self._llm, keys=True)
        if completion.cacheable and self._cache.saves:
            self._save_after(completion)
        listener = self._listener_of(completion)
        if listener is not None and completion.restore is not None:
            generated = completion.generated
            if completion.last_token is not None and llama_cpp.llama_vocab_is_eog(
                self._llm._model.vocab, completion.last_token
            ):
                generated -= 1  # llama-cpp-python does not count the end-of-generation token
            report = CompletionReport(
                completion.scope, completion.restore, generated, completion.read_seconds
            )
            listener.finished(report)

    def _listener_of(self, completion: Completion) -> CompletionListener | None:
        return completion.listener if completion.listener is not None else self._listener

    def _save_after(self, completion: Completion) -> None:
        prompt = completion.prompt
        cache = self._cache
        if completion.deferred or (prompt is not None and cache.one_capture):
            read = 0 if prompt is None else len(prompt)
            if completion.deferred or read - completion.saved_upto >= BLOCK_TOKENS:
                completion.checkpoints += self._loader.save(
                    completion.scope, completion.deferred, blocks_upto=read, prompt=prompt
                )
            for point in completion.deferred:
                self._superseding(completion, point, prompt)
        elif not cache.windows and int(self._llm.n_tokens) - completion.saved_upto >= cache.min_tokens:
            # A recurrent state holds only its last point: keep the whole context.
            n_held = int(self._llm.n_tokens)
            self._loader.save(completion.scope, [RestorePoint(n_held, cache.priority, KIND_PROMPT_END)])

    def _superseding(self, completion: Completion, point: RestorePoint, prompt: PromptTokens | None) -> None:
        """A point was stored: when it is a prompt end, the end of the conversation's turn before it
        goes (the one this scope stored last, and the one restored now; see `PrefixCache.supersede`)."""
        if prompt is None:
            return
        scope = completion.scope
        previous = (self._last_prompt_end.get(scope), self._loader.restored_prompt_end)
        key = self._cache.supersede(point, prompt.head(point.n_tokens), scope, previous, head=completion.head)
        if key is not None:
            _remember(self._last_prompt_end, scope, key)


def _read_to(llm: llama_cpp.Llama, tokens: TokenArray, point: int, grid: ReadGrid) -> None:
    """Read `tokens` on from where the context stops to `point`, in the cold read's batches (a
    prompt with images: its pieces, through `MediaPrompt.read_piece`)."""
    n_tokens = len(tokens)
    while int(llm.n_tokens) < point:
        start = int(llm.n_tokens)
        end = min(point, grid.piece_end(start, n_tokens))
        if isinstance(grid, MediaGrid):
            grid.prompt.read_piece(llm, end)
        else:
            llm.eval(tokens[start:end].tolist())


def _remember(remembered: OrderedDict[str, _T], scope: str, value: _T) -> None:
    """Keep `value` as `scope`'s latest, forgetting the scope least recently seen past the limit."""
    remembered[scope] = value
    remembered.move_to_end(scope)
    if len(remembered) > _REMEMBERED_SCOPES:
        remembered.popitem(last=False)
