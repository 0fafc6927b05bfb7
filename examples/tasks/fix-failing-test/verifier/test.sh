#!/bin/sh
# Runs hidden tests against the agent's calc.py; writes 1 or 0 to reward.txt.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
cd "$WORKSPACE" || exit 1
if python3 "${REROLL_VERIFIER_DIR:-/verifier}/test_hidden.py"; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
