"""Score the mailbox and calendar the agent leaves: one point for each change asked for (the
newsletter archived; a reply to Alice; Bob's sync booked at 11:30-12:00 on 2026-12-03, the first
free half hour) and one for leaving the rest alone; the reward is the points over 4.

    python3 check_mailbox.py --db /var/lib/mail/mail.db --reward /logs/verifier/reward.txt
    python3 check_mailbox.py --url http://mail:9001 --reward /logs/verifier/reward.txt

The state is read from the service's database (the verifier runs as root in the sandbox that holds
it; the service itself may be stopped by then) or, where the database is in another container
(the compose form), asked of the service's HTTP API.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

SEEDED_EVENTS = {1, 2, 3, 4, 5}


def from_api(base_url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, events) as the service's API lists them."""
    found = []
    for path in ("/messages?folder=all", "/events"):
        with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=30) as response:
            found.append(json.loads(response.read()))
    return found[0], found[1]


def from_db(db: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, events) read from the database, in the API's shape."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        messages = [dict(row) for row in conn.execute("SELECT * FROM messages ORDER BY id")]
        events = [dict(row) for row in conn.execute("SELECT * FROM events ORDER BY start")]
    for event in events:
        event["attendees"] = json.loads(event["attendees"])
    return messages, events


def score(all_messages: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, bool]:
    messages = {m["id"]: m for m in all_messages}
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
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", type=Path, help="the service's database")
    source.add_argument("--url", help="the service's HTTP API")
    parser.add_argument("--reward", type=Path, required=True)
    args = parser.parse_args()
    checks = score(*(from_db(args.db) if args.db else from_api(args.url)))
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {name}")
    args.reward.parent.mkdir(parents=True, exist_ok=True)
    args.reward.write_text(f"{sum(checks.values()) / len(checks)}\n")


if __name__ == "__main__":
    main()
