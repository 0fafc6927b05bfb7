"""A small mail-and-calendar service: an HTTP API over one SQLite database (Python's standard
library only, so the sandbox's own ``python3`` runs it on every backend).

    python3 service.py --db /var/lib/mail/mail.db --port 9001 [--seed seed.json]

The database is created and filled from the seed when it holds no tables; its state is the
environment's state (``[environment.state] kind = "sqlite"``). The mailbox's clock is the seed's
``now`` (a reply's time), so the same actions leave the same database. Every request opens its own
connection, so a restore of the file between requests is seen at once.

API (JSON in and out; errors are ``{"error": TEXT}`` with 400, 404 or 409):

    GET  /health                        {"ok": true}
    GET  /messages?folder=inbox         the messages of a folder (inbox, archive, sent; all), no bodies
    GET  /messages/ID                   one message, with its body
    POST /messages/ID/archive           moves it to the archive; the message
    POST /messages/ID/reply  {"body"}   sends a reply (folder sent, in_reply_to ID); 201, the reply
    GET  /events?date=YYYY-MM-DD        the events starting that day (all without date), by start
    POST /events {"title", "start", "end", "attendees"}
                                        books an event (times ``YYYY-MM-DDTHH:MM``); 201, the event;
                                        409 when it overlaps another
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SCHEMA = """
CREATE TABLE messages (
    id INTEGER PRIMARY KEY, folder TEXT NOT NULL, sender TEXT NOT NULL, recipient TEXT NOT NULL,
    subject TEXT NOT NULL, body TEXT NOT NULL, sent_at TEXT NOT NULL, in_reply_to INTEGER
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, start TEXT NOT NULL, end TEXT NOT NULL,
    attendees TEXT NOT NULL
);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
FOLDERS = ("inbox", "archive", "sent")
TIME_FORMAT = "%Y-%m-%dT%H:%M"


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def create(db: Path, seed: Path) -> None:
    """Create the database at `db` from `seed` unless it already holds the tables."""
    db.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with sqlite3.connect(db) as conn:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages'").fetchone():
            return
        data = json.loads(seed.read_text())
        conn.executescript(SCHEMA)
        conn.executemany(
            "INSERT INTO settings VALUES (?, ?)", [("owner", data["owner"]), ("now", data["now"])]
        )
        for m in data["messages"]:
            conn.execute(
                "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                (m["id"], m["folder"], m["sender"], m["recipient"], m["subject"], m["body"], m["sent_at"]),
            )
        for e in data["events"]:
            conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                (e["id"], e["title"], e["start"], e["end"], json.dumps(e["attendees"])),
            )


def _message(row: sqlite3.Row, body: bool) -> dict[str, Any]:
    keys = ["id", "folder", "sender", "recipient", "subject", "sent_at", "in_reply_to"]
    return {key: row[key] for key in keys + (["body"] if body else [])}


def _event(row: sqlite3.Row) -> dict[str, Any]:
    return {"id": row["id"], "title": row["title"], "start": row["start"], "end": row["end"],
            "attendees": json.loads(row["attendees"])}  # fmt: skip


def _time(value: object, field: str) -> str:
    try:
        return datetime.strptime(str(value), TIME_FORMAT).strftime(TIME_FORMAT)
    except ValueError:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{field} must be a time like 2026-12-03T14:00") from None


class Mail:
    """The operations, each on its own connection to the database."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db, timeout=10)
        conn.row_factory = sqlite3.Row
        return conn

    def get_message(self, conn: sqlite3.Connection, message_id: int) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"no message {message_id}")
        return row

    def list_messages(self, folder: str) -> list[dict[str, Any]]:
        if folder != "all" and folder not in FOLDERS:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"folder must be one of {', '.join(FOLDERS)} or all")
        with self.connect() as conn:
            where, args = ("", ()) if folder == "all" else ("WHERE folder = ?", (folder,))
            rows = conn.execute(f"SELECT * FROM messages {where} ORDER BY id", args).fetchall()
        return [_message(row, body=False) for row in rows]

    def read_message(self, message_id: int) -> dict[str, Any]:
        with self.connect() as conn:
            return _message(self.get_message(conn, message_id), body=True)

    def archive(self, message_id: int) -> dict[str, Any]:
        with self.connect() as conn:
            self.get_message(conn, message_id)
            conn.execute("UPDATE messages SET folder = 'archive' WHERE id = ?", (message_id,))
            return _message(self.get_message(conn, message_id), body=False)

    def reply(self, message_id: int, body: object) -> dict[str, Any]:
        if not isinstance(body, str) or not body.strip():
            raise ApiError(HTTPStatus.BAD_REQUEST, "a reply needs a non-empty 'body'")
        with self.connect() as conn:
            original = self.get_message(conn, message_id)
            settings = dict(conn.execute("SELECT key, value FROM settings").fetchall())
            subject = original["subject"]
            subject = subject if subject.lower().startswith("re:") else f"Re: {subject}"
            cursor = conn.execute(
                "INSERT INTO messages (folder, sender, recipient, subject, body, sent_at, in_reply_to) "
                "VALUES ('sent', ?, ?, ?, ?, ?, ?)",
                (settings["owner"], original["sender"], subject, body, settings["now"], message_id),
            )
            return _message(self.get_message(conn, cursor.lastrowid or 0), body=True)

    def list_events(self, date: str | None) -> list[dict[str, Any]]:
        with self.connect() as conn:
            if date:
                rows = conn.execute(
                    "SELECT * FROM events WHERE substr(start, 1, 10) = ? ORDER BY start", (date,)
                ).fetchall()
            else:
                rows = conn.execute("SELECT * FROM events ORDER BY start").fetchall()
        return [_event(row) for row in rows]

    def book(self, fields: dict[str, Any]) -> dict[str, Any]:
        title = fields.get("title")
        if not isinstance(title, str) or not title.strip():
            raise ApiError(HTTPStatus.BAD_REQUEST, "an event needs a non-empty 'title'")
        start, end = _time(fields.get("start"), "start"), _time(fields.get("end"), "end")
        if end <= start:
            raise ApiError(HTTPStatus.BAD_REQUEST, "an event must end after it starts")
        attendees = fields.get("attendees") or []
        if not isinstance(attendees, list) or not all(isinstance(a, str) for a in attendees):
            raise ApiError(HTTPStatus.BAD_REQUEST, "'attendees' must be a list of e-mail addresses")
        with self.connect() as conn:
            clash = conn.execute(
                "SELECT * FROM events WHERE start < ? AND end > ? ORDER BY start", (end, start)
            ).fetchone()
            if clash is not None:
                raise ApiError(
                    HTTPStatus.CONFLICT,
                    f"overlaps {clash['title']!r} ({clash['start']} to {clash['end']})",
                )
            cursor = conn.execute(
                "INSERT INTO events (title, start, end, attendees) VALUES (?, ?, ?, ?)",
                (title, start, end, json.dumps(attendees)),
            )
            row = conn.execute("SELECT * FROM events WHERE id = ?", (cursor.lastrowid,)).fetchone()
            return _event(row)


class Handler(BaseHTTPRequestHandler):
    mail: Mail

    def _send(self, status: HTTPStatus, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            value = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            raise ApiError(HTTPStatus.BAD_REQUEST, "the body is not JSON") from None
        if not isinstance(value, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        return value

    def _route(self, method: str) -> tuple[HTTPStatus, object]:
        url = urlsplit(self.path)
        parts = [part for part in url.path.split("/") if part]
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        if method == "GET" and parts == ["health"]:
            return HTTPStatus.OK, {"ok": True}
        if method == "GET" and parts == ["messages"]:
            return HTTPStatus.OK, self.mail.list_messages(query.get("folder", "inbox"))
        if method == "GET" and parts == ["events"]:
            return HTTPStatus.OK, self.mail.list_events(query.get("date"))
        if method == "POST" and parts == ["events"]:
            return HTTPStatus.CREATED, self.mail.book(self._body())
        if len(parts) >= 2 and parts[0] == "messages" and parts[1].isdigit():
            message_id = int(parts[1])
            if method == "GET" and len(parts) == 2:
                return HTTPStatus.OK, self.mail.read_message(message_id)
            if method == "POST" and parts[2:] == ["archive"]:
                return HTTPStatus.OK, self.mail.archive(message_id)
            if method == "POST" and parts[2:] == ["reply"]:
                return HTTPStatus.CREATED, self.mail.reply(message_id, self._body().get("body"))
        raise ApiError(HTTPStatus.NOT_FOUND, f"no route {method} {url.path}")

    def _handle(self, method: str) -> None:
        try:
            self._send(*self._route(method))
        except ApiError as exc:
            self._send(exc.status, {"error": str(exc)})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--port", type=int, default=9001)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--seed", type=Path, default=Path(__file__).with_name("seed.json"))
    args = parser.parse_args()
    create(args.db, args.seed)
    Handler.mail = Mail(args.db)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"mail service on {args.host}:{args.port}, database {args.db}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
