"""`diagnose`: the evidence, in a test script's output, that it could not run its tests.

The messages are the tools' own, as they print them (dash, bash, curl, apt, wget, pip's urllib3,
uv, Python's urllib).
"""

from __future__ import annotations

import pytest
from reroll.rollout.verify.failures import Diagnosis, diagnose


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("/tests/test.sh: 3: uvx: not found\n", Diagnosis("missing_command", "uvx")),
        ("/tests/test.sh: line 7: pytest: command not found\n", Diagnosis("missing_command", "pytest")),
        (
            "curl: (6) Could not resolve host: astral.sh\n/tests/test.sh: 4: uv: not found\n",
            Diagnosis("offline", "astral.sh"),
        ),
        (
            "W: Failed to fetch http://deb.debian.org/x  Temporary failure resolving 'deb.debian.org'\n",
            Diagnosis("offline", "deb.debian.org"),
        ),
        (
            "  x Failed to fetch: `https://pypi.org/simple/pytest/`\n"
            "  |-> dns error: failed to lookup address\n",
            Diagnosis("offline", "pypi.org"),
        ),
        (
            "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>\n",
            Diagnosis("offline", ""),
        ),
    ],
)
def test_the_tools_own_messages_name_the_command_or_the_host(output: str, expected: Diagnosis) -> None:
    assert diagnose(output) == expected
    assert expected.what in expected.message()


@pytest.mark.parametrize(
    "output",
    [
        "/tests/test.sh: 3: ./solution: not found\n",  # the agent's program: its failure
        "FAILED test_outputs.py::test_answer - assert 41 == 42\n",
        "ConnectionRefusedError: [Errno 111] Connection refused\n",  # a service the agent left down
    ],
)
def test_an_agents_failure_is_not_diagnosed(output: str) -> None:
    assert diagnose(output) is None
