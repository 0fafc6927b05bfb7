#!/bin/bash
# SkillsBench style: a Python check of the agent's output; writes the reward.
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
python3 "${REROLL_VERIFIER_DIR:-/tests}/check_report.py" > "$LOGS/verifier/reward.txt"
