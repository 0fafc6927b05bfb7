#!/bin/sh
# Legacy layout: the verifier lives in tests/ (uploaded to /tests). reward.json carries two metrics.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
cd "$WORKSPACE" || exit 1
python3 "${REROLL_VERIFIER_DIR:-/tests}/check.py" "$LOGS/verifier/reward.json"
