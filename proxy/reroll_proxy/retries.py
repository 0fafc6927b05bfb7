"""SDK retries: a request sent again after a failed attempt is a retry, not a new turn (pure).

The OpenAI and Anthropic SDKs (Stainless-generated) send ``x-stainless-retry-count`` — 0 on the
first attempt, n on the n-th retry — and some send an ``Idempotency-Key`` that stays the same
across the attempts of one call. A retry is recorded with a `RetryNote` in
``metadata.retry``: its attempt number and the step of the attempt it repeats (the latest
earlier request with the same idempotency key, else with the same body bytes).

What a replay does with the attempts a retry repeats is read from the recording by
`reroll_contracts.retries.superseded`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from reroll_contracts.trajectory import RetryNote

RETRY_COUNT_HEADER = "x-stainless-retry-count"
"""The SDKs' attempt counter: 0 on the first attempt."""
IDEMPOTENCY_HEADER = "idempotency-key"
"""The same on every attempt of one call (when the client sends it)."""


@dataclass
class RetryTracker:
    """Tells retries from new turns as requests arrive (one per proxy)."""

    _by_key: dict[str, list[int]] = field(default_factory=dict)
    _by_body: dict[bytes, int] = field(default_factory=dict)

    def observe(self, headers: Mapping[str, str], body: bytes, step: int) -> RetryNote | None:
        """Remember the request served as `step`; its `RetryNote` when it is a retry, else None.

        Args:
            headers: the request's headers (case-insensitive lookup is the caller's:
                `reroll_proxy.messages.Request`'s are).
            body: the request body's bytes, as received.
            step: the step it was served as.
        """
        key = headers.get(IDEMPOTENCY_HEADER) or None
        digest = hashlib.sha256(body).digest()
        earlier = self._by_key.get(key, []) if key else []
        counted = _retry_count(headers.get(RETRY_COUNT_HEADER))
        note = None
        if earlier or counted:
            of_step = earlier[-1] if earlier else self._by_body.get(digest)
            note = RetryNote(attempt=counted or len(earlier), of_step=of_step, idempotency_key=key)
        if key:
            self._by_key.setdefault(key, []).append(step)
        self._by_body[digest] = step
        return note


def _retry_count(value: str | None) -> int:
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        return 0
