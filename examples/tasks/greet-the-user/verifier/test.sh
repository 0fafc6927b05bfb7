#!/bin/sh
# reward 1 when greeting.txt greets in French ("Bonjour"): the user reads French, which the
# instruction does not say. Only an agent that asks (the ask_user tool, `reroll run --ask-user`;
# the User of examples/trials/ask-the-user.yaml answers "French") can know; one that guesses
# between languages is right by chance only.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
if grep -qi 'bonjour' "$WORKSPACE/greeting.txt" 2>/dev/null; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
