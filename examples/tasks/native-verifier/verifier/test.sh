#!/bin/sh
# Native layout: uploaded to /verifier. The task's environment (GREETING_NAME) reaches the verifier too.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
if [ -n "$GREETING_NAME" ] && [ "$(cat "$WORKSPACE/greeting.txt" 2>/dev/null)" = "Hello, $GREETING_NAME!" ]; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
