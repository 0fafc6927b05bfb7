"""The agent's /app/fizzbuzz.py against the expected output."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(os.environ.get("REROLL_WORKSPACE", "/app")) / "fizzbuzz.py"


def word(i: int) -> str:
    return "FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)


def expected(n: int) -> list[str]:
    return [word(i) for i in range(1, n + 1)]


def run(n: int) -> list[str]:
    result = subprocess.run([sys.executable, str(SCRIPT), str(n)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_script_exists() -> None:
    assert SCRIPT.is_file()


def test_first_fifteen() -> None:
    assert run(15) == expected(15)


def test_hundred() -> None:
    assert run(100) == expected(100)
