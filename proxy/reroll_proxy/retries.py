"""SDK retries: a request sent again after a failed attempt is a retry, not a new turn (pure).

The OpenAI and Anthropic SDKs (Stainless-generated) send ``x-stainless-retry-count`` — 0 on the
first attempt, n on the n-th retry — and some send an ``Idempotency-Key`` that stays the same
across the attempts of one call. A retry is recorded with a `RetryNote` in
``metadata.retry``: its attempt number and the step of the attempt it repeats (the latest
earlier request with the same idempotency key, else with the same body bytes).

An attempt whose connection dropped before its answer was recorded left no line (the proxy
cancels its handler): its retry is then a retry of nothing served (``of_step`` None), and a
replay serves it like any turn. An attempt dropped after it was recorded (a stream whose last
event the agent never got) does leave one. What a replay does with that (`superseded`): when
the attempt a retry repeats got a complete, successful answer (status < 400, no error) the agent
still sent the request again, so its connection dropped before the answer arrived: the agent
went on with the retry's answer. That attempt is *superseded*: a replay never serves it (the
agent, whose connection no longer drops, sends the request once and is served the retry's
answer) and the fidelity report lists it as ``retried``, not ``missing``. An attempt that got an
error keeps its place: the agent saw the error, and in the replay sees it again and retries again.
So does an attempt that carries an injected fault (``metadata.fault``, e.g. a stream cut after
some events): a replay reproduces the fault, and the agent retries as it did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from reroll_contracts.trajectory import Exchange, RetryNote

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
            headers: the request's headers (case-insensitive lookup is the caller's: aiohttp's are).
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


def superseded(exchanges: Sequence[Exchange]) -> set[int]:
    """The positions of the recorded attempts a replay skips (see the module docstring).

    Args:
        exchanges: the recorded exchanges, in recorded order.

    Returns:
        0-based positions in `exchanges`.
    """
    position = {
        exchange.metadata.step if exchange.metadata.step is not None else i: i
        for i, exchange in enumerate(exchanges)
    }
    skipped = set()
    for exchange in exchanges:
        retry = exchange.metadata.retry
        if retry is None or retry.of_step is None or retry.of_step not in position:
            continue
        index = position[retry.of_step]
        attempt = exchanges[index]
        answered = 0 < attempt.response.status_code < 400 and attempt.metadata.error is None
        if answered and attempt.metadata.fault is None:
            skipped.add(index)
    return skipped
