#!/bin/bash
# Terminal-Bench / Harbor style: pytest with a CTRF report; reward 1 when the report counts every
# test passed. The reward comes from the report, not from pytest's exit status: code of the agent
# that runs inside pytest could end it early with status 0 (os._exit(0)); the report is written
# only when the session finishes, into a fresh folder the agent cannot write.
# ${REROLL_...:-default}: the same paths as in Harbor, or reroll's local sandbox's folders.
LOGS="${REROLL_LOGS_DIR:-/logs}"
TESTS="${REROLL_VERIFIER_DIR:-/tests}"
REPORTS=$(mktemp -d) || exit 1  # mode 0700: no planted report, no planted venv
PYTHON=python3
if ! "$PYTHON" -c "import pytest, ctrf" 2>/dev/null; then  # not the task's image (reroll's local sandbox)
  VENV="$REPORTS/venv"
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q --disable-pip-version-check \
    pytest==9.2.0 pytest-json-ctrf==0.6.1 || exit 1
  PYTHON="$VENV/bin/python"
fi
mkdir -p "$LOGS/verifier"
"$PYTHON" -m pytest --ctrf "$REPORTS/ctrf.json" "$TESTS/test_outputs.py" -rA
cp "$REPORTS/ctrf.json" "$LOGS/verifier/ctrf.json" 2>/dev/null
python3 -I "$TESTS/reward_from_ctrf.py" "$REPORTS/ctrf.json" > "$LOGS/verifier/reward.txt"
rm -rf "$REPORTS"
