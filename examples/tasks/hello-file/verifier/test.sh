#!/bin/sh
# reward 1 when hello.txt holds exactly "Hello, reroll!" (one line).
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
if [ "$(cat "$WORKSPACE/hello.txt" 2>/dev/null)" = "Hello, reroll!" ]; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
