#!/bin/sh
# Asks the mail service for its state (its HTTP API) and scores the three changes asked for.
exec python3 "$(dirname "$0")/check_mailbox.py" --url "${MAIL_URL:-http://localhost:9001}" \
  --reward "${REROLL_LOGS_DIR:-/logs}/verifier/reward.txt"
