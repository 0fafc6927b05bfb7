#!/bin/sh
# reward 1 when the agent wrote answer.txt.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
if [ -f "$WORKSPACE/answer.txt" ]; then echo 1 > "$LOGS/verifier/reward.txt"; else echo 0 > "$LOGS/verifier/reward.txt"; fi
