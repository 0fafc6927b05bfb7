"""The ``mail-calendar`` example's programs on their own, as real processes run by the system's
``python3`` (as in the sandbox): the service over a fresh SQLite database, its MCP server spoken
to over stdio as an agent's MCP client does, the oracle's solution and the verifier's scoring."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spawns
TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "mail-calendar"
PROGRAMS = TASK / "environment" / "workspace" / ".services" / "mail"
PYTHON = "/usr/bin/python3"  # the sandbox's python3, not this venv's


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The mail service on a free port over a fresh database: (its URL, the database)."""
    port, db = free_port(), tmp_path / "state" / "mail.db"
    process = subprocess.Popen(
        [PYTHON, str(PROGRAMS / "service.py"), "--db", str(db), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                    assert json.loads(response.read()) == {"ok": True}
                    break
            except OSError:
                assert process.poll() is None, process.communicate()[1]
                time.sleep(0.1)
        else:
            pytest.fail("the mail service never answered /health")
        yield url, db
    finally:
        process.terminate()
        process.communicate(timeout=10)


class McpClient:
    """An MCP client over stdio: one JSON-RPC message a line."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [PYTHON, str(PROGRAMS / "mcp_server.py"), "--url", url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}})
        assert self.process.stdout is not None
        response: dict[str, Any] = json.loads(self.process.stdout.readline())
        assert response["id"] == self.next_id
        return response

    def call(self, tool: str, **arguments: Any) -> tuple[Any, bool]:
        result = self.request("tools/call", {"name": tool, "arguments": arguments})["result"]
        text = result["content"][0]["text"]
        try:
            return json.loads(text), result["isError"]
        except json.JSONDecodeError:
            return text, result["isError"]

    def close(self) -> None:
        self.process.communicate(timeout=10)  # closes stdin: the server ends at its end
        assert self.process.returncode == 0


def rows(db: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


def verify(source: str | Path, tmp_path: Path) -> tuple[float, str]:
    """The verifier's reward and what it printed, the state read from a URL (the service's API) or
    a path (its database)."""
    reward = tmp_path / "reward.txt"
    flag = "--db" if isinstance(source, Path) else "--url"
    done = subprocess.run(
        [PYTHON, str(TASK / "tests" / "check_mailbox.py"), flag, str(source), "--reward", str(reward)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return float(reward.read_text()), done.stdout


def test_the_mcp_server_changes_the_database_through_the_service(
    service: tuple[str, Path], tmp_path: Path
) -> None:
    url, db = service
    client = McpClient(url)
    try:
        hello = client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                              "clientInfo": {"name": "test", "version": "0"}})  # fmt: skip
        assert hello["result"]["protocolVersion"] == "2025-06-18"
        assert hello["result"]["capabilities"] == {"tools": {"listChanged": False}}
        client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})  # no answer to a notification
        tools = [tool["name"] for tool in client.request("tools/list")["result"]["tools"]]
        assert tools == ["list_messages", "read_message", "archive_message", "reply_to_message",
                         "list_events", "book_event"]  # fmt: skip
        inbox, failed = client.call("list_messages")
        assert not failed and [m["id"] for m in inbox] == [1, 2, 3, 4] and "body" not in inbox[0]
        assert "lunch" in client.call("read_message", id=2)[0]["body"]
        assert client.call("archive_message", id=1) == ({**inbox[0], "folder": "archive"}, False)
        reply, failed = client.call("reply_to_message", id=2, body="Yes, Thursday works!")
        assert not failed and reply["subject"] == "Re: Lunch on Thursday?"
        day = [(e["start"], e["end"]) for e in client.call("list_events", date="2026-12-03")[0]]
        assert day[:3] == [("2026-12-03T09:00", "2026-12-03T10:00"), ("2026-12-03T10:00", "2026-12-03T11:00"),
                           ("2026-12-03T11:00", "2026-12-03T11:30")]  # fmt: skip
        clash, failed = client.call(
            "book_event", title="Sync", start="2026-12-03T10:30", end="2026-12-03T11:00"
        )
        assert failed and clash == "overlaps 'Design review' (2026-12-03T10:00 to 2026-12-03T11:00)"
        booked, failed = client.call(
            "book_event", title="Project sync with Bob", start="2026-12-03T11:30", end="2026-12-03T12:00",
            attendees=["bob@example.com"],
        )  # fmt: skip
        assert not failed and booked["id"] == 6
        assert client.call("read_message", id=99) == ("no message 99", True)
        assert client.request("resources/list")["error"]["code"] == -32601
    finally:
        client.close()
    assert rows(db, "SELECT id, folder FROM messages WHERE id <= 2") == [(1, "archive"), (2, "inbox")]
    assert rows(db, "SELECT recipient, in_reply_to FROM messages WHERE folder = 'sent'") == [
        ("alice@example.com", 2)
    ]
    assert rows(db, "SELECT start, end FROM events WHERE id = 6") == [
        ("2026-12-03T11:30", "2026-12-03T12:00")
    ]
    assert verify(url, tmp_path) == verify(db, tmp_path)
    assert verify(db, tmp_path)[0] == 1.0


def test_the_oracle_scores_one_and_an_untouched_mailbox_a_quarter(
    service: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = service
    reward, printed = verify(url, tmp_path)
    assert (
        reward == 0.25 and "PASS: nothing else changed" in printed and "FAIL: newsletter archived" in printed
    )
    subprocess.run(
        ["sh", str(TASK / "solution" / "solve.sh")],
        env={**os.environ, "MAIL_URL": url},
        check=True,
        timeout=60,
    )
    assert verify(url, tmp_path)[0] == 1.0


def test_a_second_booking_or_a_wrong_archive_costs_the_last_point(
    service: tuple[str, Path], tmp_path: Path
) -> None:
    url, db = service
    subprocess.run(
        ["sh", str(TASK / "solution" / "solve.sh")],
        env={**os.environ, "MAIL_URL": url},
        check=True,
        timeout=60,
    )
    client = McpClient(url)
    try:
        client.call("archive_message", id=4)
    finally:
        client.close()
    reward, printed = verify(db, tmp_path)
    assert reward == 0.75 and "FAIL: nothing else changed" in printed


def test_the_service_keeps_its_state_across_a_restart(tmp_path: Path) -> None:
    """The database is seeded once: a service restarted over it (a restored snapshot) keeps its rows."""
    db = tmp_path / "mail.db"
    for _ in range(2):
        create = "import sys; sys.path.insert(0, sys.argv[1]); import service, pathlib; "
        create += "service.create(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[1]) / 'seed.json')"
        subprocess.run([PYTHON, "-c", create, str(PROGRAMS), str(db)], check=True, timeout=30)
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE messages SET folder = 'archive' WHERE id = 1")
    assert rows(db, "SELECT count(*) FROM messages") == [(5,)]
