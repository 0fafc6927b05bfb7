#!/bin/bash
# Terminal-Bench / Harbor style: pytest with a CTRF report; reward 1 when the report counts every
# test passed. The reward comes from the report, not from pytest's exit status: code of the agent
# that runs inside pytest could end it early with status 0 (os._exit(0)); the report is written
# only when the session finishes, into a fresh folder the agent cannot write.
# Under reroll ($REROLL_GUARD set) the tests run guarded: as a user who cannot write that folder,
# their outcomes sent to the guard over a pipe with canary tests that must come back right;
# the guard writes the CTRF report. Elsewhere (Harbor) pytest writes it, as before.
# ${REROLL_...:-default}: the same paths as in Harbor, or reroll's local sandbox's folders.
LOGS="${REROLL_LOGS_DIR:-/logs}"
TESTS="${REROLL_VERIFIER_DIR:-/tests}"
REPORTS=$(mktemp -d) || exit 1  # mode 0700: no planted report
PYTHON=python3
if ! "$PYTHON" -c "import pytest, ctrf" 2>/dev/null; then  # not the task's image (reroll's local sandbox)
  VENV="$(mktemp -d)/venv" || exit 1  # root's: no planted venv; readable by the guard's user
  chmod 755 "$(dirname "$VENV")"
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q --disable-pip-version-check \
    pytest==9.2.0 pytest-json-ctrf==0.6.1 || exit 1
  PYTHON="$VENV/bin/python"
fi
mkdir -p "$LOGS/verifier"
if [ -n "${REROLL_GUARD:-}" ]; then
  "$REROLL_GUARD" --python "$PYTHON" --ctrf "$REPORTS/ctrf.json" -- "$TESTS/test_outputs.py" -rA
else
  "$PYTHON" -m pytest --ctrf "$REPORTS/ctrf.json" "$TESTS/test_outputs.py" -rA
fi
cp "$REPORTS/ctrf.json" "$LOGS/verifier/ctrf.json" 2>/dev/null
python3 -I "$TESTS/reward_from_ctrf.py" "$REPORTS/ctrf.json" > "$LOGS/verifier/reward.txt"
rm -rf "$REPORTS" ${VENV:+"$(dirname "$VENV")"}
