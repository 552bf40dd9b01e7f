"""One line of `snapcache doctor`'s report: a name, ok/warn/fail, and what was found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the report: a name, ok/warn/fail, and what was found."""

    name: str
    status: Status
    detail: str
