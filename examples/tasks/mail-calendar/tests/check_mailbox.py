"""Score the mailbox and calendar the agent leaves: one point for each change asked for (the
newsletter archived; a reply to Alice; Bob's sync booked at 11:30-12:00 on 2026-12-03, the first
free half hour) and one for leaving the rest alone; the reward is the points over 4.

    python3 check_mailbox.py --url http://localhost:9001 --reward /logs/verifier/reward.txt
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

SEEDED_EVENTS = {1, 2, 3, 4, 5}


def get(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def score(base_url: str) -> dict[str, bool]:
    messages = {m["id"]: m for m in get(f"{base_url}/messages?folder=all")}
    events = get(f"{base_url}/events")
    replies = [m for m in messages.values() if m["folder"] == "sent"]
    new_events = [e for e in events if e["id"] not in SEEDED_EVENTS]
    booked = [
        e for e in new_events
        if e["start"] == "2026-12-03T11:30" and e["end"] == "2026-12-03T12:00"
        and "sync" in e["title"].lower() and "bob@example.com" in e["attendees"]
    ]  # fmt: skip
    return {
        "newsletter archived": messages[1]["folder"] == "archive",
        "Alice got a reply": any(
            m["in_reply_to"] == 2 and m["recipient"] == "alice@example.com" for m in replies
        ),
        "Bob's sync booked at 11:30": len(booked) == 1,
        "nothing else changed": (
            [messages[i]["folder"] for i in (2, 3, 4, 5)] == ["inbox", "inbox", "inbox", "archive"]
            and all(m["in_reply_to"] == 2 for m in replies)
            and len(new_events) == len(booked)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--reward", type=Path, required=True)
    args = parser.parse_args()
    checks = score(args.url.rstrip("/"))
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {name}")
    args.reward.parent.mkdir(parents=True, exist_ok=True)
    args.reward.write_text(f"{sum(checks.values()) / len(checks)}\n")


if __name__ == "__main__":
    main()
