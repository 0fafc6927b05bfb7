#!/bin/bash
# Terminal-Bench / Harbor style: pytest with a CTRF report; reward 1 when every test passes.
# ${REROLL_...:-default}: the same paths as in Harbor, or reroll's local sandbox's folders.
LOGS="${REROLL_LOGS_DIR:-/logs}"
TESTS="${REROLL_VERIFIER_DIR:-/tests}"
PYTHON=python3
if ! "$PYTHON" -c "import pytest, ctrf" 2>/dev/null; then  # not the task's image (reroll's local sandbox)
  VENV="${TMPDIR:-/tmp}/verifier-venv"
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q --disable-pip-version-check \
    pytest==9.2.0 pytest-json-ctrf==0.6.1 || exit 1
  PYTHON="$VENV/bin/python"
fi
mkdir -p "$LOGS/verifier"
if "$PYTHON" -m pytest --ctrf "$LOGS/verifier/ctrf.json" "$TESTS/test_outputs.py" -rA; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
