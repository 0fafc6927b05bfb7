#!/bin/sh
# The reference solution: the three changes through the mail service's HTTP API ($MAIL_URL).
set -e
exec python3 - <<'PY'
import json
import os
import urllib.request

BASE = os.environ.get("MAIL_URL", "http://localhost:9001")


def post(path, body):
    request = urllib.request.Request(
        BASE + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        print(path, json.loads(response.read()))


post("/messages/1/archive", {})
post("/messages/2/reply", {"body": "Hi Alice,\n\nyes, Thursday at 12:30 works for me. See you there!\n\nSam"})
post("/events", {"title": "Project sync with Bob", "start": "2026-12-03T11:30", "end": "2026-12-03T12:00",
                 "attendees": ["bob@example.com"]})
PY
