"""Fixtures that run the real scripted model and the real proxy as subprocesses (``python -m``),
and drive them with the official ``openai`` SDK."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from reroll_contracts.errors import UpstreamError
from reroll_contracts.proxy import (
    DivergencePolicy,
    FormatName,
    ProxyConfig,
    ProxyStatus,
    ReadyFile,
    ReplayConfig,
    UpstreamConfig,
)
from reroll_proxy.server import RunningProxy
from reroll_proxy.server import start_proxy as start_in_process
from reroll_proxy.upstream import CannedResponse, InMemoryUpstream

from tests.conftest import spawning

READY_TIMEOUT_SECONDS = 20.0
TOKEN = "rollout-token-for-tests"
CONTROLLER_TOKEN = "controller-token-for-tests"
"""Opens ``/_reroll/*`` (given through ``REROLL_TEST_CONTROLLER_TOKEN``); `TOKEN` gets 403 there."""
UPSTREAM_KEY = "sk-upstream-secret-never-on-disk"
AGENT_MODEL = "gpt-test"
SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "content": "I'll list the files.\nThen decide — naïvely? 🚀",
            "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}],
        },
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "cat notes.txt"}},
                {"name": "write_file", "arguments": {"path": "b.txt", "text": "line 1\nline 2"}},
            ]
        },
        {"content": "Done. Everything is in order."},
    ]
}
TURNS = len(SCRIPT["turns"])


@dataclass
class Service:
    """A ``python -m MODULE`` subprocess that announced itself through a ready file."""

    process: subprocess.Popen[bytes]
    ready: ReadyFile | None
    log_path: Path

    @property
    def base_url(self) -> str:
        assert self.ready is not None
        return self.ready.address

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_service(module: str, args: list[str], workdir: Path, name: str) -> Service:
    """Start ``python -m module args --ready-file ...`` and wait for its ready file."""
    ready_file = workdir / f"{name}.ready.json"
    log_path = workdir / f"{name}.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--ready-file", str(ready_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "REROLL_TEST_UPSTREAM_KEY": UPSTREAM_KEY,
                "REROLL_TEST_CONTROLLER_TOKEN": CONTROLLER_TOKEN,
            },
        )
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not ready_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            service = Service(process, None, log_path)
            service.stop()
            pytest.fail(f"{name} did not start (exit {process.returncode}):\n{log_path.read_text()}")
        time.sleep(0.02)
    return Service(process, ReadyFile.model_validate_json(ready_file.read_bytes()), log_path)


@dataclass
class Proxy:
    """A running proxy subprocess and what the tests need to talk to it."""

    service: Service
    trajectory_path: Path
    clients: list[openai.OpenAI] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.service.base_url

    def client(self, token: str = TOKEN) -> openai.OpenAI:
        """An SDK client for the agent side (no retries: a retried 409/5xx would hide what happened)."""
        client = openai.OpenAI(base_url=self.base_url, api_key=token, max_retries=0, timeout=30)
        self.clients.append(client)
        return client

    @property
    def root_url(self) -> str:
        """The URL without ``/v1``."""
        return self.base_url.removesuffix("/v1")

    def status(self) -> ProxyStatus:
        code, _, body = http_json(
            "GET", self.root_url + "/_reroll/status", headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
        )
        assert code == 200, body
        return ProxyStatus.model_validate(body)

    def lines(self) -> list[dict[str, Any]]:
        """The trajectory's exchange lines."""
        if not self.trajectory_path.exists():
            return []
        return [json.loads(line) for line in self.trajectory_path.read_text().splitlines()]


StartProxy = Callable[..., Proxy]


def http_json(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """A plain HTTP request (stdlib): (status, lower-cased headers, JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.load(exc)


@pytest.fixture(scope="module")
@spawning
def scripted_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The scripted model serving `SCRIPT` (stateless, so one per module is enough)."""
    workdir = tmp_path_factory.mktemp("scripted-model")
    script = workdir / "script.json"
    script.write_text(json.dumps(SCRIPT))
    service = start_service("reroll_proxy.scripted", ["--script", str(script)], workdir, "scripted-model")
    yield service
    service.stop()


@pytest.fixture(scope="module")
@spawning
def start_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartProxy]:
    """Start proxies: ``start_proxy(upstream_url=, replay_path=, cut_index=, model=, policy=,
    upstream_format=, **config)``."""
    proxies: list[Proxy] = []
    counter = iter(range(10_000))

    def start(
        *,
        upstream_url: str | None = None,
        model: str | None = None,
        replay_path: Path | None = None,
        cut_index: int | None = None,
        policy: DivergencePolicy = "warn",
        upstream_format: FormatName | None = None,
        **more_config: Any,
    ) -> Proxy:
        more_config.setdefault("controller_token_env", "REROLL_TEST_CONTROLLER_TOKEN")
        workdir = tmp_path_factory.mktemp(f"proxy-{next(counter)}")
        trajectory = workdir / "run" / "trajectory" / "llm_trajectory.jsonl"
        upstream = None
        if upstream_url is not None:
            upstream = UpstreamConfig(
                base_url=upstream_url,
                model=model,
                api_key_env="REROLL_TEST_UPSTREAM_KEY",
                timeout_seconds=10,
                api_format=upstream_format,
            )
        config = ProxyConfig(
            token=TOKEN,
            trajectory_path=trajectory,
            replay=None
            if replay_path is None
            else ReplayConfig(trajectory_path=replay_path, cut_index=cut_index, divergence_policy=policy),
            upstream=upstream,
            **more_config,
        )
        (workdir / "proxy.json").write_text(config.model_dump_json())
        service = start_service("reroll_proxy", ["--config", str(workdir / "proxy.json")], workdir, "proxy")
        proxy = Proxy(service, trajectory)
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        for client in proxy.clients:
            client.close()
        proxy.service.stop()


@dataclass
class Turn:
    """What the agent received at one turn."""

    content: str | None
    tool_calls: list[tuple[str, str, str]]
    """(id, name, arguments) per tool call."""
    chunks: int = 1
    """Stream chunks received (1 for a non-streamed answer)."""


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], *, stream: bool, attempts: int = 1) -> Turn:
    """One chat completion through `client`, as an agent would make it; a connection broken
    mid-stream (which the SDK does not retry) is retried up to `attempts` times in all."""
    for _ in range(attempts - 1):
        try:
            return ask(client, messages, stream=stream)
        except openai.APIConnectionError:
            continue
    params: Any = messages
    if stream:
        return _ask_streamed(client, params)
    message = client.chat.completions.create(model=AGENT_MODEL, messages=params).choices[0].message
    calls = [
        (c.id, c.function.name, c.function.arguments)
        for c in message.tool_calls or []
        if c.type == "function"
    ]
    return Turn(message.content, calls)


def _ask_streamed(client: openai.OpenAI, messages: Any) -> Turn:
    content: str | None = None
    calls: dict[int, list[str]] = {}
    chunks = 0
    with client.chat.completions.create(model=AGENT_MODEL, messages=messages, stream=True) as events:
        for chunk in events:
            chunks += 1
            for choice in chunk.choices:
                if choice.delta.content is not None:
                    content = (content or "") + choice.delta.content
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, ["", "", ""])
                    function = delta.function
                    call[0] += delta.id or ""
                    call[1] += (function.name or "") if function else ""
                    call[2] += (function.arguments or "") if function else ""
    return Turn(content or None, [(c[0], c[1], c[2]) for _, c in sorted(calls.items())], chunks)


AskTurn = Callable[..., Turn]
"""``ask_turn(client, messages, stream=)``: one turn of the agent loop (`ask`, or a wrapper)."""


def converse(
    client: openai.OpenAI,
    turns: int,
    *,
    stream: bool,
    task: str = "List the files.",
    ask_turn: AskTurn = ask,
) -> tuple[list[Turn], list[dict[str, Any]]]:
    """Run `turns` turns of a tool-calling agent loop; return what it received and the final messages."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": task},
    ]
    received = []
    for _ in range(turns):
        turn = ask_turn(client, messages, stream=stream)
        received.append(turn)
        assistant: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.tool_calls:
            assistant["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, n, a in turn.tool_calls
            ]
        messages.append(assistant)
        messages += [
            {"role": "tool", "tool_call_id": i, "content": f"output of {n}"} for i, n, _ in turn.tool_calls
        ]
    return received, messages


@dataclass
class Recording:
    """A trajectory recorded live from the scripted model, and what the agent received then."""

    path: Path
    turns: list[Turn]


def record(start_proxy: StartProxy, scripted_model: Service, *, stream: bool) -> Recording:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    turns, _ = converse(proxy.client(), TURNS, stream=stream)
    proxy.service.stop()
    return Recording(proxy.trajectory_path, turns)


@pytest.fixture(scope="module")
def recording(start_proxy: StartProxy, scripted_model: Service) -> Recording:
    """A non-streamed recording of the whole script."""
    return record(start_proxy, scripted_model, stream=False)


@pytest.fixture(scope="module")
def stream_recording(start_proxy: StartProxy, scripted_model: Service) -> Recording:
    """A streamed recording of the whole script."""
    return record(start_proxy, scripted_model, stream=True)


ADMIN_TOKEN = "admin-token-for-tests"


@pytest.fixture(scope="module")
@spawning
def shared_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A ``python -m reroll_proxy --shared`` subprocess with the admin token `ADMIN_TOKEN`."""
    workdir = tmp_path_factory.mktemp("shared-proxy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REROLL_TEST_ADMIN_TOKEN", ADMIN_TOKEN)
        service = start_service(
            "reroll_proxy", ["--shared", "--admin-token-env", "REROLL_TEST_ADMIN_TOKEN"], workdir, "shared"
        )
    yield service
    service.stop()


def admin(token: str = ADMIN_TOKEN) -> dict[str, str]:
    """The headers of a request with the shared proxy's admin token (or `token`)."""
    return {"Authorization": f"Bearer {token}"}


def register_rollout(
    shared: Service,
    trajectory: Path,
    *,
    token: str,
    controller_token: str,
    upstream: str | None = None,
    replay: Path | None = None,
    plan: list[dict[str, Any]] | None = None,
) -> tuple[int, Any]:
    """Add a rollout to `shared` (``POST /_reroll/rollouts``): (status, answer body)."""
    config: dict[str, Any] = {"token": token, "trajectory_path": str(trajectory)}
    if upstream is not None:
        config["upstream"] = {"base_url": upstream, "timeout_seconds": 10}
    if replay is not None:
        config["replay"] = {"trajectory_path": str(replay), "divergence_policy": "strict"}
    if plan is not None:
        plan_path = trajectory.with_suffix(".plan.yaml")
        plan_path.write_text(yaml.safe_dump({"seed": 1, "rules": plan}))
        config["faults"] = {"plan_path": str(plan_path), "seed": 1}
    registration = {"config": config, "controller_token": controller_token, "upstream_api_key": UPSTREAM_KEY}
    code, _, body = http_json(
        "POST", shared.base_url.removesuffix("/v1") + "/_reroll/rollouts", registration, admin()
    )
    return code, body


IN_MEMORY_KEY = "sk-in-memory-upstream"
"""The upstream key of `in_memory_proxy`'s rollouts."""
StartInMemory = Callable[..., Awaitable[tuple[RunningProxy, InMemoryUpstream]]]
"""``await in_memory_proxy(*answers)``: (an in-process proxy, its in-memory upstream)."""


@pytest.fixture
async def in_memory_proxy(tmp_path: Path) -> AsyncIterator[StartInMemory]:
    """``await in_memory_proxy(*answers)``: a proxy in this process whose upstream is an
    `InMemoryUpstream` giving `answers`; (the proxy, its upstream)."""
    running: list[RunningProxy] = []

    async def start(*answers: CannedResponse | UpstreamError) -> tuple[RunningProxy, InMemoryUpstream]:
        upstream = InMemoryUpstream(answers)
        config = ProxyConfig(
            token=TOKEN,
            trajectory_path=tmp_path / f"run-{len(running)}" / "llm_trajectory.jsonl",
            upstream=UpstreamConfig(
                base_url="http://provider.invalid/v1", model="swapped", api_key=IN_MEMORY_KEY
            ),
        )
        proxy = await start_in_process(config, upstream)
        running.append(proxy)
        return proxy, upstream

    yield start
    for proxy in running:
        await proxy.stop()


def lines(proxy: RunningProxy) -> list[dict[str, Any]]:
    """The exchange lines of an in-process proxy's trajectory."""
    path = proxy.rollout.config.trajectory_path
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def post_place(proxy: Proxy, body: object, headers: dict[str, str], path: str = "/_reroll/place") -> int:
    """POST `body` to the proxy's `path` (its place endpoint by default) as a plain HTTP client; the
    status code."""
    request = urllib.request.Request(
        proxy.root_url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={**headers, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code
