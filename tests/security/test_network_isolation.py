"""Red team, issue 12 item 3: under network ``none`` a docker sandbox reaches the LLM proxy's port
on its gateway and nothing else — no other host address or port, no other rollout.

Before the rollout's own network and firewall (`reroll.sandbox.docker.firewall`), the agent connected
to the test's listeners on the bridge's gateway, on docker0 and on the host's own address (all
rollouts shared one internal bridge, which filtered nothing towards the host), and, before
``enable_icc=false``, to another rollout's container.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest
import yaml
from reroll.agents import AGENTS_FILE_ENV
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker import firewall
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.docker.networks import ISOLATED_PREFIX
from reroll.sandbox.docker.prune import prune
from reroll.tasks.task import Task, load_task

from tests.conftest import EXAMPLES
from tests.jobs.test_branch import URLLIB_AGENTS

pytestmark = [pytest.mark.slow, pytest.mark.spawns, pytest.mark.usefixtures("docker_images")]
REROLL = str(Path(sys.executable).parent / "reroll")

PROBE = """
import json, socket, sys
results = {}
for target in json.loads(sys.argv[1]):
    host, port, kind = target
    try:
        if kind == "udp":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(b"probe", (host, port))
            results[f"{host}:{port}/udp"] = "sent"
        else:
            socket.create_connection((host, port), timeout=3).close()
            results[f"{host}:{port}"] = "connected"
    except OSError as exc:
        results[f"{host}:{port}" + ("/udp" if kind == "udp" else "")] = type(exc).__name__
print(json.dumps(results))
"""


BASE = DockerSandboxConfig(image="reroll/base:bookworm")
"""reroll's base image as it is (the task's own image is not needed to probe the network)."""


def none_task() -> Task:
    task = load_task(EXAMPLES / "hello-file")
    environment = task.spec.environment.model_copy(update={"network": "none"})
    return task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})


def host_addresses() -> dict[str, str]:
    """Interface → the host's IPv4 address on it (loopback left out)."""
    done = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True)
    return {
        link["ifname"]: info["local"]
        for link in json.loads(done.stdout)
        for info in link.get("addr_info", [])
        if link["ifname"] != "lo"
    }


async def probe(sandbox: DockerSandbox, targets: list[tuple[str, int, str]]) -> dict[str, str]:
    """Try every ``(host, port, "tcp" | "udp")`` from the sandbox, as the agent's user."""
    result = await sandbox.exec(
        ["python3", "-c", PROBE, json.dumps(targets)], user=sandbox.layout.agent_user, timeout_seconds=120
    )
    assert result.exit_code == 0, result.output_text()
    outcome: dict[str, str] = json.loads(result.stdout)
    return outcome


@contextlib.contextmanager
def listeners(addresses: list[str]) -> Iterator[dict[str, socket.socket]]:
    """A TCP listener on every address (port chosen by the kernel), keyed by address."""
    with contextlib.ExitStack() as stack:
        yield {address: stack.enter_context(socket.create_server((address, 0))) for address in addresses}


@pytest.fixture
async def pair() -> AsyncIterator[tuple[DockerSandbox, DockerSandbox]]:
    """Two concurrent sandboxes under network ``none``."""
    first = DockerSandbox(sandbox_spec(none_task()), f"netiso-{uuid.uuid4().hex[:8]}", BASE)
    second = DockerSandbox(sandbox_spec(none_task()), f"netiso-{uuid.uuid4().hex[:8]}", BASE)
    try:
        await asyncio.gather(first.start(), second.start())
        yield first, second
    finally:
        await asyncio.gather(first.stop(), second.stop())


async def test_only_the_proxy_port_is_reachable(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    sandbox, other = pair
    gateway = await sandbox.host_address()
    other_gateway = await other.host_address()
    addresses = host_addresses()  # docker0, eth0 (the host's primary address), both bridges, ...
    assert gateway in addresses.values() and "docker0" in addresses, addresses
    with (
        listeners([gateway, *addresses.values()]) as own,
        socket.create_server(("0.0.0.0", 0)) as wildcard,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
    ):
        udp.bind(("0.0.0.0", 0))
        udp.settimeout(2)
        proxy = socket.create_server((gateway, 0))  # stands for the rollout's LLM proxy
        other_proxy = socket.create_server((other_gateway, 0))  # the other rollout's proxy
        await sandbox.allow_host_port(proxy.getsockname()[1])
        await other.allow_host_port(other_proxy.getsockname()[1])
        wildcard_port = wildcard.getsockname()[1]
        targets = [(address, server.getsockname()[1], "tcp") for address, server in own.items()]
        targets += [(address, wildcard_port, "tcp") for address in {gateway, *addresses.values()}]
        targets += [(other_gateway, other_proxy.getsockname()[1], "tcp")]
        targets += [(gateway, udp.getsockname()[1], "udp"), (gateway, 53, "udp")]
        with proxy, other_proxy:
            outcome = await probe(sandbox, [(gateway, proxy.getsockname()[1], "tcp"), *targets])
            assert outcome.pop(f"{gateway}:{proxy.getsockname()[1]}") == "connected", "the proxy is reachable"
            assert not [target for target, result in outcome.items() if result == "connected"], outcome
            with pytest.raises(TimeoutError):
                udp.recvfrom(100)  # no datagram reached the host either
            # The other rollout still reaches its own proxy.
            assert (await probe(other, [(other_gateway, other_proxy.getsockname()[1], "tcp")])) == {
                f"{other_gateway}:{other_proxy.getsockname()[1]}": "connected"
            }


async def test_rollouts_do_not_reach_each_other(pair: tuple[DockerSandbox, DockerSandbox]) -> None:
    sandbox, other = pair
    assert other.container is not None
    listener = "import socket, time; s = socket.create_server(('0.0.0.0', 8000)); time.sleep(60)"
    await other.exec(["sh", "-c", f'setsid python3 -c "{listener}" </dev/null >/dev/null 2>&1 &'])
    other.container.reload()
    (address,) = [net["IPAddress"] for net in other.container.attrs["NetworkSettings"]["Networks"].values()]
    for _ in range(20):  # until the listener is up
        if (await probe(other, [("127.0.0.1", 8000, "tcp")]))["127.0.0.1:8000"] == "connected":
            break
        await asyncio.sleep(0.5)
    else:
        pytest.fail("the listener never came up")
    assert (await probe(sandbox, [(address, 8000, "tcp")]))[f"{address}:8000"] != "connected"


async def test_the_network_and_its_firewall_go_with_the_rollout() -> None:
    """`stop` removes both; after a controller died, ``reroll sandbox prune --run-id`` does."""
    sandbox = DockerSandbox(sandbox_spec(none_task()), f"netiso-{uuid.uuid4().hex[:8]}", BASE)
    await sandbox.start()
    key = sandbox._firewall_key
    assert key in firewall.tables()
    await sandbox.stop()
    assert key not in firewall.tables()
    with contextlib.closing(docker.from_env()) as engine, pytest.raises(docker.errors.NotFound):
        engine.networks.get(ISOLATED_PREFIX + key)

    leftover = DockerSandbox(sandbox_spec(none_task()), f"netiso-{uuid.uuid4().hex[:8]}", BASE)
    await leftover.start()
    key = leftover._firewall_key
    await leftover.disconnect()  # its controller "died": nothing stops it
    try:
        removed = await asyncio.to_thread(prune, leftover.run_id)
        assert removed["networks"] == [ISOLATED_PREFIX + key]
        assert key not in firewall.tables()
    finally:
        await leftover.stop()


def test_an_honest_agent_reaches_the_proxy_and_scores(tmp_path: Path) -> None:
    """A real rollout under ``--network none``: the agent's model calls pass, reward 1."""
    (tmp_path / "agents.yaml").write_text(yaml.safe_dump(URLLIB_AGENTS))
    task = str(EXAMPLES / "fix-failing-test")
    options = ["--sandbox", "docker", "--network", "none", "--jobs-dir", "jobs"]
    done = subprocess.run(
        [REROLL, "run", task, "--agent", "urllib-chat", "--model", "scripted", *options],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, AGENTS_FILE_ENV: str(tmp_path / "agents.yaml")},
    )
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = (tmp_path / "jobs").glob("*/*/result.json")
    result = json.loads(result_file.read_text())
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
    assert result["counts"]["exchanges"] >= 2
