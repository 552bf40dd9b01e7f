"""Where a request's time to its first token went: its own restore and read, and what it waited for.

The batched scheduler runs every request's work on one thread, so a request's first token waits for
the work it does itself and for the work the scheduler does for others meanwhile. `PhaseClock` adds
up the scheduler's seconds by kind of work; a request takes a reading when it is admitted and
another at its first token, and the difference, less its own part, is what it waited for.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["FirstTokenPhases", "PhaseClock", "PhaseMark", "RequestTimer"]


@dataclass(frozen=True, slots=True)
class FirstTokenPhases:
    """Seconds from a request's submission to its first token, by what the scheduler was doing.

    - `queue`: from submission until the request took a sequence (a full context, or an earlier
      request reading the chat prefix it will restore, and the steps that ran meanwhile);
    - `restore`: its own restore (or the live prefix it took over);
    - `read`: its own prompt read: the tokens after the restored prefix, in llama.cpp's decodes;
    - `others_restore`, `others_read`: other requests' restores and reads that ran after it was
      admitted and before its first token;
    - `save`: states stored (hashed, compressed, written to the tiers) in that time;
    - `generate`: generation steps of running requests in that time.

    What the six do not cover (the scheduler's own bookkeeping, a thread waiting for the CPU) is
    `first_token - total`.
    """

    queue: float
    restore: float
    read: float
    others_restore: float
    others_read: float
    save: float
    generate: float
    first_token: float

    @property
    def total(self) -> float:
        return (
            self.queue
            + self.restore
            + self.read
            + self.others_restore
            + self.others_read
            + self.save
            + self.generate
        )

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class PhaseMark:
    """The clock's totals at one moment."""

    restore: float
    read: float
    save: float
    generate: float


class PhaseClock:
    """Seconds the scheduler spent, by kind of work, since it started (used on its thread only)."""

    def __init__(self) -> None:
        self.restore = 0.0
        self.read = 0.0
        self.save = 0.0
        self.generate = 0.0

    def mark(self) -> PhaseMark:
        return PhaseMark(self.restore, self.read, self.save, self.generate)

    def phases_since(
        self, mark: PhaseMark, *, queue: float, restore: float, read: float, first_token: float
    ) -> FirstTokenPhases:
        """A request's phases: admitted at `mark`, after `queue` seconds, with its own `restore`
        and `read` seconds (counted in the clock too), its first token `first_token` seconds after
        its submission."""
        return FirstTokenPhases(
            queue=queue,
            restore=restore,
            read=read,
            others_restore=max(0.0, self.restore - mark.restore - restore),
            others_read=max(0.0, self.read - mark.read - read),
            save=self.save - mark.save,
            generate=self.generate - mark.generate,
            first_token=first_token,
        )


class RequestTimer:
    """One request's own seconds (its restore and its read) and the clock's reading when it was
    admitted, to tell its phases at its first token."""

    def __init__(self, clock: PhaseClock, queued: float) -> None:
        self.admitted_at = clock.mark()
        self.queued = queued
        self.restore = 0.0
        self.read = 0.0

    def phases(self, clock: PhaseClock, first_token: float) -> FirstTokenPhases:
        """Its phases now, at its first token, `first_token` seconds after its submission."""
        return clock.phases_since(
            self.admitted_at, queue=self.queued, restore=self.restore, read=self.read, first_token=first_token
        )
