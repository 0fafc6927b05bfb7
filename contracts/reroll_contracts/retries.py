"""SDK retries in a recording: which recorded attempts a replay skips (pure).

The proxy records a request that repeats an earlier attempt with a `RetryNote` in
``metadata.retry`` (its attempt number and the step of the attempt it repeats; how it tells
them: `reroll_proxy.retries`). An attempt whose connection dropped before its answer was
recorded left no line: its retry is a retry of nothing served (``of_step`` None), and a replay
serves it like any turn. An attempt dropped after it was recorded (a stream whose last event the
agent never got) does leave one. What a replay does with that (`superseded`): when the attempt a
retry repeats got a complete, successful answer (status < 400, no error) the agent still sent the
request again, so its connection dropped before the answer arrived: the agent went on with the
retry's answer. That attempt is *superseded*: a replay never serves it (the agent, whose
connection no longer drops, sends the request once and is served the retry's answer) and the
fidelity report lists it as ``retried``, not ``missing``. An attempt that got an error keeps its
place: the agent saw the error, and in the replay sees it again and retries again. So does an
attempt that carries an injected fault (``metadata.fault``, e.g. a stream cut after some events):
a replay reproduces the fault, and the agent retries as it did.

The proxy's replay engine and the controller's ``reroll replay`` report both read it from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from reroll_contracts.trajectory import Exchange


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
