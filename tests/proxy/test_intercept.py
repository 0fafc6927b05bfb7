"""HTTPS interception end to end with real parts: the official SDKs with their default (hard-coded)
provider URLs, as subprocesses with the environment a sandbox gets, through ``mitmdump`` (its own
virtualenv, installed on first use) → the proxy → the scripted model: record, byte-equal replay,
cutover; and the network policy for every other host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from reroll.host.intercept import Interceptor, OtherHosts, ca_bundle, ensure_mitmproxy, sandbox_env
from reroll_contracts.errors import InfrastructureError

from tests.conftest import ROOT
from tests.proxy.conftest import TOKEN, Proxy, Service, StartProxy
from tests.proxy.intercept_client import HARD_CODED_KEY
from tests.proxy.sdk_agents import AGENTS
from tests.proxy.test_formats import SCRIPT, TURNS, model, texts, without_model

pytestmark = pytest.mark.spawns  # every test runs mitmproxy and the proxy as subprocesses

__all__ = ["model"]  # the module-scoped scripted model fixture of test_formats (SCRIPT, every format)
CLIENT_TIMEOUT_SECONDS = 120
PATHS = {"openai-chat": "/v1/chat/completions", "openai-responses": "/v1/responses",
         "anthropic-messages": "/v1/messages"}  # fmt: skip


@pytest.fixture(scope="module")
def mitmproxy_installed() -> None:
    """mitmproxy's virtualenv, through the same lazy installer as rollouts (cached after the first)."""
    try:
        ensure_mitmproxy()
    except InfrastructureError as exc:
        pytest.fail(f"cannot install mitmproxy for the interception tests: {exc}")


Intercept = Callable[..., Any]


@pytest.fixture
async def intercept(tmp_path: Path, mitmproxy_installed: None) -> AsyncIterator[Intercept]:
    """``await intercept(proxy, other_hosts=)``: a started `Interceptor` in front of `proxy`."""
    fronts: list[Interceptor] = []

    async def start(proxy: Proxy, other_hosts: OtherHosts = "refuse") -> Interceptor:
        workdir = tmp_path / f"intercept-{len(fronts)}"
        workdir.mkdir()
        front = Interceptor(target=proxy.base_url, token=TOKEN, workdir=workdir, other_hosts=other_hosts)
        fronts.append(front)
        await front.start()
        return front

    yield start
    for front in fronts:
        await front.stop()


def sandbox_environment(front: Interceptor, tmp_path: Path) -> dict[str, str]:
    """What a sandboxed agent gets: a minimal environment plus the interception variables."""
    bundle = tmp_path / "intercept-ca.pem"
    bundle.write_bytes(ca_bundle())
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return base | sandbox_env(front.proxy_url, str(bundle), no_proxy=["127.0.0.1"])


def run_client(env: dict[str, str], name: str, *, stream: bool, use_async: bool) -> dict[str, Any]:
    """The hard-coded-URL agent as a subprocess; its transcript."""
    argv = [sys.executable, "-m", "tests.proxy.intercept_client", name, str(TURNS)]
    argv += ["--stream"] * stream + ["--async"] * use_async
    done = subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_SECONDS
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("name", list(AGENTS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_hard_coded_provider_url_is_recorded_replayed_and_cut_over(
    tmp_path: Path, start_proxy: StartProxy, model: Service, intercept: Intercept, name: str, stream: bool
) -> None:
    use_async = stream  # sync and async clients both go through the proxy environment variables

    recorder = start_proxy(upstream_url=model.base_url)
    env = sandbox_environment(await intercept(recorder), tmp_path)
    recorded = run_client(env, name, stream=stream, use_async=use_async)
    recorder.service.stop()
    lines = recorder.lines()
    assert [line["request"]["path"] for line in lines] == [PATHS[name]] * TURNS
    assert [line["metadata"]["stream"] for line in lines] == [stream] * TURNS
    assert [texts(name, line["response"]["body"]) for line in lines] == [
        texts(name, final) for final in recorded["finals"]
    ]
    assert texts(name, recorded["finals"][2]) == ("Done. Everything is in order.", [])
    assert HARD_CODED_KEY not in recorder.trajectory_path.read_text()
    if stream:
        assert all(count > 5 for count in recorded["events"])

    replayer = start_proxy(replay_path=recorder.trajectory_path)
    env = sandbox_environment(await intercept(replayer), tmp_path)
    assert run_client(env, name, stream=stream, use_async=use_async) == recorded
    status = replayer.status()
    assert (status.served_replayed, status.served_live, status.divergences) == (TURNS, 0, [])
    replay_lines = replayer.lines()
    for key in ("events", "body"):
        assert [line["response"][key] for line in replay_lines] == [line["response"][key] for line in lines]

    cut = start_proxy(
        upstream_url=model.base_url, model="swapped-model", replay_path=recorder.trajectory_path, cut_index=1
    )
    env = sandbox_environment(await intercept(cut), tmp_path)
    continued = run_client(env, name, stream=stream, use_async=use_async)
    assert continued["finals"][0] == recorded["finals"][0]
    assert [without_model(f) for f in continued["finals"]] == [without_model(f) for f in recorded["finals"]]
    cut_lines = cut.lines()
    assert [line["metadata"]["source"] for line in cut_lines] == ["replayed", "live", "live"]
    assert [line["metadata"]["model"] for line in cut_lines] == ["gpt-test", "swapped-model", "swapped-model"]


def fetch_through(front: Interceptor, url: str) -> tuple[int, str]:
    """GET `url` through the interceptor (urllib, no CA check needed: plain HTTP or refused CONNECT)."""
    proxies = {"http": front.proxy_url, "https": front.proxy_url}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()
    except urllib.error.URLError as exc:  # a refused CONNECT: "Tunnel connection failed: 403 ..."
        return 0, str(exc.reason)


async def test_other_hosts_are_refused_under_policy_none(
    start_proxy: StartProxy, model: Service, intercept: Intercept
) -> None:
    proxy = start_proxy(upstream_url=model.base_url)
    front = await intercept(proxy, "refuse")
    host = urllib.parse.urlsplit(proxy.base_url).netloc  # a host other than the providers
    code, text = fetch_through(front, f"http://{host}/healthz")
    assert code == 403 and "not reachable from this sandbox" in text
    assert fetch_through(front, f"https://{host}/healthz") == (0, "Tunnel connection failed: 403 Forbidden")
    assert fetch_through(front, "https://pypi.org/simple/")[0] == 0


async def test_other_hosts_pass_through_under_policy_full(
    start_proxy: StartProxy, model: Service, intercept: Intercept
) -> None:
    proxy = start_proxy(upstream_url=model.base_url)
    front = await intercept(proxy, "pass")
    host = urllib.parse.urlsplit(proxy.base_url).netloc  # a host other than the providers
    code, text = fetch_through(front, f"http://{host}/healthz")
    assert code == 200 and json.loads(text) == {"ok": True}


async def test_curl_with_the_sandbox_environment_is_intercepted(
    tmp_path: Path, start_proxy: StartProxy, model: Service, intercept: Intercept
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    proxy = start_proxy(upstream_url=model.base_url)
    env = sandbox_environment(await intercept(proxy), tmp_path)
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    done = subprocess.run(
        ["curl", "-sS", "--fail", "https://api.openai.com/v1/chat/completions", "--json", json.dumps(body)],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["choices"][0]["message"]["content"] == SCRIPT["turns"][0]["content"]
    assert [line["metadata"]["source"] for line in proxy.lines()] == ["live"]
