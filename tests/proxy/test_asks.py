"""ask_user through a real proxy process: reroll's MCP server (a subprocess speaking JSON-RPC on
stdio, as an agent's MCP client runs it) asks, the proxy holds the call until the controller
answers; malformed arguments get clear errors; the agent's token opens none of the controller's
ask routes (attack: an agent answering its own question)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from reroll.rollout.turns.asks import SERVER_SOURCE
from reroll_contracts.asks import MAX_PENDING_ASKS

from tests.proxy.conftest import CONTROLLER_TOKEN, TOKEN, Service, StartProxy, http_json, post_place
from tests.rollout.turns.test_asks import call

pytestmark = pytest.mark.spawns  # the proxy, the scripted model and the MCP server run as subprocesses
CONTROLLER = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
AGENT = {"Authorization": f"Bearer {TOKEN}"}


class McpServer:
    """reroll's ask_user MCP server as a subprocess (the sandbox's python3 stands in: the host's)."""

    def __init__(self, ask_url: str, token: str) -> None:
        env = {**os.environ, "REROLL_ASK_URL": ask_url, "REROLL_ASK_TOKEN": token}
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER_SOURCE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)
        self.process.stdout.close()


def test_a_question_is_held_until_the_controller_answers(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    place = {"turn": 0, "scene": "main", "role": "agent", "round": None}
    assert post_place(proxy, place, CONTROLLER) == 204
    server = McpServer(proxy.root_url + "/reroll/ask_user", TOKEN)
    try:
        started = server.send(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "x"}}
        )
        assert started["result"]["protocolVersion"] == "x" and "tools" in started["result"]["capabilities"]
        (tool,) = server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})["result"]["tools"]
        assert tool["name"] == "ask_user" and tool["inputSchema"]["required"] == ["question"]
        answered: dict[str, Any] = {}
        question = {"question": "Which language?", "options": ["English", "French"]}
        asking = threading.Thread(target=lambda: answered.update(server.send(call(2, "ask_user", question))))
        asking.start()
        code, _, pending = http_json("GET", proxy.root_url + "/_reroll/asks?wait=10", headers=CONTROLLER)
        assert code == 200
        (ask,) = pending
        assert (ask["question"], ask["options"], ask["step"], ask["place"]) == (
            "Which language?", ["English", "French"], 0, place,
        )  # fmt: skip
        assert asking.is_alive()  # held until answered
        assert post_place(proxy, {"answer": "French"}, AGENT, f"/_reroll/asks/{ask['id']}") == 403
        assert post_place(proxy, {"answer": 3}, CONTROLLER, f"/_reroll/asks/{ask['id']}") == 400
        assert post_place(proxy, {"answer": "French"}, CONTROLLER, f"/_reroll/asks/{ask['id']}") == 204
        asking.join(timeout=10)
        assert answered["result"] == {"content": [{"type": "text", "text": "French"}], "isError": False}
        assert post_place(proxy, {"answer": "x"}, CONTROLLER, f"/_reroll/asks/{ask['id']}") == 404
        assert http_json("GET", proxy.root_url + "/_reroll/asks?wait=0", headers=CONTROLLER)[2] == []
    finally:
        server.close()


def test_the_agent_token_cannot_read_the_questions(start_proxy: StartProxy, scripted_model: Service) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    assert http_json("GET", proxy.root_url + "/_reroll/asks?wait=0", headers=AGENT)[0] == 403
    assert (
        http_json(
            "POST", proxy.root_url + "/reroll/ask_user", {"question": "q"}, {"Authorization": "Bearer no"}
        )[0]
        == 401
    )


MALFORMED = [
    ({"options": ["a"]}, "question: Field required"),
    ({"question": "  "}, "question: Value error, the question is blank"),
    ({"question": "q", "options": ["a", "a"]}, "options: Value error, the options repeat"),
    ({"question": "q", "options": "a,b"}, "options: Input should be a valid list"),
    ({"question": "q", "colour": "red"}, "colour: Extra inputs are not permitted"),
    ({"question": "q", "options": [str(n) for n in range(21)]}, "options: List should have at most 20 items"),
]


def test_malformed_questions_sent_to_the_proxy_get_400_naming_the_field(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    """What an agent posting directly (bypassing the MCP server's own checks) gets."""
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    for body, message in MALFORMED:
        code, _, answer = http_json("POST", proxy.root_url + "/reroll/ask_user", body, AGENT)
        assert code == 400 and message in answer["error"], (body, answer)


def test_a_flood_of_questions_is_refused_past_the_limit(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    """Attack: an agent posting questions without end holds at most MAX_PENDING_ASKS requests."""
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    answers: list[Any] = []
    url = proxy.root_url + "/reroll/ask_user"
    askers = [
        threading.Thread(
            target=lambda n=n: answers.append(http_json("POST", url, {"question": f"q{n}"}, AGENT))
        )
        for n in range(MAX_PENDING_ASKS)
    ]
    for asker in askers:
        asker.start()
    waiting: list[dict[str, Any]] = []
    while len(waiting) < MAX_PENDING_ASKS:
        waiting += http_json("GET", proxy.root_url + "/_reroll/asks?wait=5", headers=CONTROLLER)[2]
    code, _, refused = http_json("POST", url, {"question": "one more"}, AGENT)
    assert code == 429 and f"{MAX_PENDING_ASKS} questions are waiting already" in refused["error"]
    for ask in waiting:
        assert (
            post_place(proxy, {"answer": ask["question"].upper()}, CONTROLLER, f"/_reroll/asks/{ask['id']}")
            == 204
        )
    for asker in askers:
        asker.join(timeout=10)
    assert sorted(body["answer"] for code, _, body in answers) == sorted(
        f"Q{n}" for n in range(MAX_PENDING_ASKS)
    )
