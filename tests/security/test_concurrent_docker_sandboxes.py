"""Red team, issue 32: two docker rollouts started at once, one attacking the other — the docker
counterpart of ``test_concurrent_local_sandboxes.py``.

The victim's agent leaves a process running (a ``sleep`` with a marker on its command line), a
file in its workspace, a System V shared-memory segment and a POSIX one (``/dev/shm``), both
mode 0600, and a server answering a secret on an abstract Unix socket and on a TCP port of every
address of its container. From inside the attacker, as its agent and as its root, a hunt looks
for each: the process in ``/proc`` (a signal needs its pid: none of the victim's is visible), the
file through any process's ``/proc/<pid>/root``, the segments by key and name, the abstract socket
by name, and the TCP server at the victim container's address. The same hunt run in the victim
finds every one (the control).

The namespaces (PID, mount, IPC, network) stop all of it under network ``none``, where each
rollout has a firewalled network of its own. Under ``full`` both join the shared ``reroll-full``
bridge, and before issue 32 its inter-container traffic was on: the attacker's agent read the
victim's server at its address (``tcp`` in the hunt). Now the bridge is made with inter-container
traffic off (`reroll.sandbox.docker.networks.ensure_full_network`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.tasks.task import load_task

from tests.conftest import EXAMPLES
from tests.security.test_concurrent_local_sandboxes import MAKE_SEGMENT, SHM_KEY

pytestmark = [pytest.mark.slow, pytest.mark.spawns, pytest.mark.timeout(240)]
PORT = 47321
ABSTRACT = "reroll-victim-socket"
SERVE = r"""
import socket, sys, threading
secret = sys.argv[1].encode()
def serve(server):
    while True:
        connection, _ = server.accept()
        connection.sendall(secret)
        connection.close()
local = socket.socket(socket.AF_UNIX)
local.bind("\0" + sys.argv[2])
local.listen()
tcp = socket.socket()
tcp.bind(("0.0.0.0", int(sys.argv[3])))
tcp.listen()
threading.Thread(target=serve, args=(local,), daemon=True).start()
serve(tcp)
"""
HUNT = r"""
import ctypes, json, os, socket, sys
marker, name, key, shm, abstract, address, port, secret = sys.argv[1:]
marker = str(int(marker) + 1)  # not on the hunt's own command line
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            found.append(f"process {pid}")
        if os.path.exists(f"/proc/{pid}/root/app/{name}"):
            found.append(f"file via /proc/{pid}/root")
    except OSError:
        pass
if ctypes.CDLL(None, use_errno=True).shmget(int(key), 0, 0) >= 0:
    found.append("sysv segment")
if os.path.exists(f"/dev/shm/{shm}"):
    found.append("posix segment")
def answer(family, where):
    try:
        with socket.socket(family) as peer:
            peer.settimeout(2)
            peer.connect(where)
            return peer.recv(64) == secret.encode()
    except OSError:
        return False
if answer(socket.AF_UNIX, "\0" + abstract):
    found.append("abstract")
if answer(socket.AF_INET, (address, int(port))):
    found.append("tcp")
print(json.dumps(found))
"""
EVERYTHING = ["process", "file via", "sysv segment", "posix segment", "abstract", "tcp"]


def address_of(sandbox: DockerSandbox) -> str:
    """The victim container's IPv4 address on its (first) network."""
    assert sandbox.container is not None
    sandbox.container.reload()
    networks = sandbox.container.attrs["NetworkSettings"]["Networks"]
    return str(next(iter(networks.values()))["IPAddress"])


@pytest.mark.usefixtures("docker_images")
@pytest.mark.parametrize("network", ["none", "full"])
async def test_two_concurrent_docker_rollouts_cannot_see_signal_attach_or_reach_each_other(
    network: str,
) -> None:
    task = load_task(EXAMPLES / "hello-file")
    environment = task.spec.environment.model_copy(update={"network": network})
    spec = sandbox_spec(
        task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})
    )
    config, tag = DockerSandboxConfig(image="reroll/base:bookworm"), uuid.uuid4().hex[:6]
    attacker = DockerSandbox(spec, f"concurrent-a-{tag}", config)
    victim = DockerSandbox(spec, f"concurrent-b-{tag}", config)
    try:
        await asyncio.gather(attacker.host_address(), victim.host_address())
        await asyncio.gather(attacker.start(), victim.start())  # at once
        marker, secret, name, shm = (
            f"{secrets.randbelow(10**6) + 10**6}",
            secrets.token_hex(8),
            "victim.txt",
            "rr-v",
        )
        agent = victim.layout.agent_user
        plant = (
            f"echo {secret} > {name}; (umask 077; echo {secret} > /dev/shm/{shm}); "
            f'python3 -c "$0" {SHM_KEY} {secret}; '
            f'setsid python3 -c "$1" {secret} {ABSTRACT} {PORT} >/dev/null 2>&1 & '
            f"setsid sleep {marker} >/dev/null 2>&1 & sleep 1"
        )
        planted = await victim.exec(["sh", "-c", plant, MAKE_SEGMENT, SERVE], cwd="/app", user=agent)
        assert planted.exit_code == 0, planted.output_text()
        hunt = ["python3", "-c", HUNT, str(int(marker) - 1), name, str(SHM_KEY), shm, ABSTRACT]
        hunt += [await asyncio.to_thread(address_of, victim), str(PORT), secret]
        control = await victim.exec(hunt, user=agent)
        found = json.loads(control.stdout)
        assert all(any(item.startswith(kind) for item in found) for kind in EVERYTHING), control.output_text()
        for user in (attacker.layout.agent_user, ""):  # the attacker's agent, then its root
            result = await attacker.exec(hunt, user=user)
            assert result.exit_code == 0, result.output_text()
            assert json.loads(result.stdout) == [], f"the attacker's {user or 'root'} found {result.stdout!r}"
        alive = await victim.exec(["sh", "-c", f"pgrep -f 'sleep {marker}'"])
        assert alive.exit_code == 0, "the victim's process still runs"
    finally:
        await asyncio.gather(attacker.stop(), victim.stop(), return_exceptions=True)
