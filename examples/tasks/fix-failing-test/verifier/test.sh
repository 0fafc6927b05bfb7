#!/bin/sh
# Runs the hidden tests against the agent's calc.py; the reward comes from their JUnit report.
# Why a report and not the exit status: the agent's code runs inside the test process (importing
# calc runs it), so it can end that process early with status 0 (os._exit(0) at import); a report
# is written only when the whole run finishes, into a fresh folder the agent cannot write.
# Under reroll ($REROLL_GUARD set) the tests run guarded: as a user who cannot write that folder
# (an atexit hook of calc.py cannot rewrite the report), their outcomes sent to the guard over a
# pipe, with canary tests (put beside these for the run) that must come back right. Elsewhere
# (Harbor) as before.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
HERE="${REROLL_VERIFIER_DIR:-/verifier}"
mkdir -p "$LOGS/verifier"
REPORTS=$(mktemp -d) || exit 1  # mode 0700, owned by the verifier's user: no planted report
cd "$HERE" || exit 1  # not the workspace: a planted pytest.py there is never imported
export REROLL_WORKSPACE="$WORKSPACE"
if [ -n "${REROLL_GUARD:-}" ]; then  # pytest, else unittest where the sandbox has no pytest
  "$REROLL_GUARD" --junitxml "$REPORTS/junit.xml" -- -q -p no:cacheprovider test_hidden.py
elif python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider --junitxml="$REPORTS/junit.xml" test_hidden.py
else  # no pytest (e.g. the local sandbox on a host without it): the same report, from unittest
  python3 run_unittest.py "$REPORTS/junit.xml" test_hidden.py
fi
cp "$REPORTS/junit.xml" "$LOGS/verifier/junit.xml" 2>/dev/null
python3 -I reward_from_junit.py "$REPORTS/junit.xml" > "$LOGS/verifier/reward.txt"
rm -rf "$REPORTS"
