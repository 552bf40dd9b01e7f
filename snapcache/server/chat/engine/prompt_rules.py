"""Per-session noise taken out of a request's text before it is rendered, so prefixes stay shared.

Claude Code starts its system prompt with a block such as
`x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;` whose values change
from one session to the next (some versions add a per-request `cch=` nonce): every token after it
would miss a prefix cache. The line is dropped unless the server is told to keep it. Users add their
own rules (`--normalize REGEX`): text matching one is deleted wherever a message carries text. What
the rules changed is remembered per scope, for `/snapcache/why`.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from snapcache.errors import InvalidArgument

__all__ = ["BILLING_HEADER_RULE", "PromptRules"]

BILLING_HEADER_RULE = "claude-code-billing-header"
_BILLING_HEADER = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(?:\n|\Z)", re.MULTILINE)
_REMEMBERED_SCOPES = 64


class PromptRules:
    """The rules of one server: the billing-header rule (unless `keep_billing_header`) and the
    user's patterns, applied in that order; thread-safe."""

    def __init__(self, patterns: Sequence[str] = (), *, keep_billing_header: bool = False) -> None:
        rules: list[tuple[str, re.Pattern[str]]] = []
        if not keep_billing_header:
            rules.append((BILLING_HEADER_RULE, _BILLING_HEADER))
        for pattern in patterns:
            try:
                rules.append((pattern, re.compile(pattern, re.MULTILINE)))
            except re.error as exc:
                raise InvalidArgument(f"--normalize {pattern!r} is not a regular expression: {exc}") from None
        self._rules = tuple(rules)
        self._lock = threading.Lock()
        self._last: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._rules)

    def clean(self, text: str, matched: set[str]) -> str:
        """`text` with what every rule matches deleted; the rules that matched are added to `matched`."""
        for name, pattern in self._rules:
            text, count = pattern.subn("", text)
            if count:
                matched.add(name)
        return text

    def remember(self, scope: str, matched: set[str]) -> None:
        """Note which rules changed the scope's latest request (for `/snapcache/why`)."""
        with self._lock:
            self._last[scope] = tuple(name for name in self.names if name in matched)
            self._last.move_to_end(scope)
            if len(self._last) > _REMEMBERED_SCOPES:
                self._last.popitem(last=False)

    def report(self, scope: str) -> dict[str, Any]:
        """What `/snapcache/why` says of the rules: those in force, and those that changed the
        scope's latest request (None: no request seen in it)."""
        with self._lock:
            last = self._last.get(scope)
        return {"rules": list(self.names), "matched_in_last_request": None if last is None else list(last)}
