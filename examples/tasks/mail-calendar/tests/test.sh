#!/bin/sh
# Reads the mail service's state and scores the three changes asked for: from its database where
# it is in this sandbox (the [[environment.services]] form), else from its HTTP API at $MAIL_URL.
DB=/var/lib/mail/mail.db
REWARD="${REROLL_LOGS_DIR:-/logs}/verifier/reward.txt"
if [ -f "$DB" ]; then
  exec python3 "$(dirname "$0")/check_mailbox.py" --db "$DB" --reward "$REWARD"
fi
exec python3 "$(dirname "$0")/check_mailbox.py" --url "${MAIL_URL:-http://localhost:9001}" --reward "$REWARD"
