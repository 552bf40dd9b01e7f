"""What a completion reports about the cache: what it restored, what it did, what `warm` stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from snapcache.key import SnapshotKey
from snapcache.llama.stored.phases import FirstTokenPhases

__all__ = ["CompletionListener", "CompletionReport", "RestoreInfo", "Source", "WarmResult"]

Source = Literal["ram", "disk", "remote", "context"]


@dataclass(frozen=True, slots=True)
class RestoreInfo:
    """What the last completion reused of its prompt.

    `restored_tokens` came from a snapshot (`source` "ram", "disk" or "remote": the slowest tier that
    served part of it) or were already in the Llama's context ("context"); `evaluated_tokens` were
    read by llama.cpp. A prompt exactly as long as its
    snapshot evaluates its last token again (a state carries no logits), so the two can add up to one
    more than `prompt_tokens`. `checkpoints` counts the states saved while reading the prompt.
    `restore_seconds` is the time spent finding that prefix and handing it to llama.cpp (on a miss,
    the time the lookup took). `phases`: where the time to the first token went, on the batched
    path (None on the single-sequence one, where it is the restore and the read).
    """

    prompt_tokens: int
    restored_tokens: int
    evaluated_tokens: int
    source: Source | None
    checkpoints: int
    restore_seconds: float = 0.0
    phases: FirstTokenPhases | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens llama.cpp did not read (the OpenAI API's `cached_tokens`)."""
        return self.prompt_tokens - self.evaluated_tokens


@dataclass(frozen=True, slots=True)
class CompletionReport:
    """What one completion did with the cache, handed to a listener when the completion ends.

    `read_seconds` is the time from the moment the prompt reached the hook (restore, checkpoints and
    the read of the evaluated tokens, all of it) to the first sampled token; None when no token was
    sampled.
    """

    scope: str
    restore: RestoreInfo
    completion_tokens: int
    read_seconds: float | None


class CompletionListener(Protocol):
    """Told what each completion restored (before it reads the rest of the prompt) and did in the end."""

    def restored(self, scope: str, info: RestoreInfo) -> None: ...

    def finished(self, report: CompletionReport) -> None: ...


@dataclass(frozen=True, slots=True)
class WarmResult:
    """The snapshot `warm` stored (or found already stored: `from_cache`)."""

    key: SnapshotKey
    token_count: int
    state_bytes: int
    seconds: float
    from_cache: bool
