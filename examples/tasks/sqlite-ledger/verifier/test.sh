#!/bin/sh
# reward 1 when the ledger (environment_state.txt: the rows reroll's state query printed) holds
# at least one entry and done.txt exists.
LOGS="${REROLL_LOGS_DIR:-/logs}"
WORKSPACE="${REROLL_WORKSPACE:-/app}"
mkdir -p "$LOGS/verifier"
if [ -s "$(dirname "$0")/environment_state.txt" ] && [ -f "$WORKSPACE/done.txt" ]; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
