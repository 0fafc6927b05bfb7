"""The isolated local sandbox: nothing it does reaches the host, network ``none`` reaches only the
proxy's ports, its processes die with it; and the plain fallback where namespaces are forbidden."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from reroll import conformance
from reroll.host.notices import warn_once
from reroll.host.owner import owner_label
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.disk import LOCAL_PREFIX, SizedDisk
from reroll.sandbox.docker.disk import remove as remove_disk
from reroll.sandbox.layout import SANDBOX_HOSTNAME
from reroll.sandbox.local import backend, rootview
from reroll.sandbox.local.backend import local_sandbox
from reroll.sandbox.local.identity import SLOT_ID_START
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.netns import listening_ports
from reroll.sandbox.local.plain import LocalSandbox
from reroll.sandbox.local.rootview import RootView
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.tasks.task import Task
from reroll.tasks.variants import with_network
from reroll_contracts.errors import SandboxError

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
]

WRITES = r"""
set -e
for target in /usr/local/bin/reroll-planted /etc/ssl/reroll-planted /etc/passwd \
    "$HOST_HOME/reroll-planted"; do
  if (echo planted > "$target") 2>/dev/null; then echo "wrote $target"; fi
done
echo planted > /etc/reroll-planted
echo planted > /root/reroll-planted
rm -f /etc/hostname.reroll-absent
python3 -m venv /tmp/venv
/tmp/venv/bin/python -m pip install --quiet --no-index --no-deps --disable-pip-version-check \
  /tmp/reroll_planted-1-py3-none-any.whl
/tmp/venv/bin/python -c 'import reroll_planted; print(reroll_planted.VALUE)'
"""
"""The system's folders are read-only in the sandbox; its own ``/`` (``/etc``, ``/root``,
``/tmp``…) is writable; HOST_HOME is not in the sandbox at all (made there on the tmpfs at most)."""


def _wheel() -> bytes:
    """A minimal pure-Python wheel (PEP 427) of the package ``reroll_planted``, built in memory."""
    files = {
        "reroll_planted/__init__.py": b"VALUE = 'planted'\n",
        "reroll_planted-1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: reroll-planted\nVersion: 1\n",
        "reroll_planted-1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(content)}")
    files["reroll_planted-1.dist-info/RECORD"] = (
        "\n".join([*record, "reroll_planted-1.dist-info/RECORD,,"]) + "\n"
    ).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def _state(*roots: Path) -> str:
    """A hash of every path, size, mode and mtime under `roots` (the host's ``.cache`` left out:
    other processes of the machine write there)."""
    digest = hashlib.sha256()
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != ".cache")
            for name in sorted([*names, *dirs]):
                path = os.path.join(folder, name)
                with_stat = os.lstat(path)
                digest.update(
                    f"{path}\0{with_stat.st_size}\0{with_stat.st_mode}\0{with_stat.st_mtime_ns}\n".encode()
                )
    return digest.hexdigest()


@pytest.fixture
def host_places() -> list[Path]:
    """The places of the host the test writes to through the sandbox: /etc, /usr/local, the
    interpreter's site-packages (where ``pip install`` goes), HOME's top level."""
    return [Path("/etc"), Path("/usr/local"), Path(sysconfig.get_paths()["purelib"]), Path.home()]


async def test_system_folders_are_read_only_and_writes_stay_in_the_sandbox(
    task: Task, host_places: list[Path]
) -> None:
    before = _state(*host_places[:3])
    async with IsolatedSandbox(sandbox_spec(task), "host-unchanged") as sandbox:
        await sandbox.put_file("/tmp/reroll_planted-1-py3-none-any.whl", _wheel())
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOST_HOME": str(Path.home())}
        out = await conformance.sh(sandbox, WRITES, env=env)
        assert out.strip().endswith("planted"), out  # the writes and the install happened, inside
        assert "wrote /usr" not in out and "wrote /etc" not in out, out  # read-only system files
        assert (await conformance.sh(sandbox, "cat /etc/reroll-planted")).strip() == "planted"
    assert not Path("/etc/reroll-planted").exists()
    assert not Path("/usr/local/bin/reroll-planted").exists()
    assert not (Path.home() / "reroll-planted").exists()
    assert _state(*host_places[:3]) == before, "the host changed"  # HOME: its planted name, above


@pytest.fixture
def none_task(task: Task) -> Task:
    return with_network(task, "none")


PROBE = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=3) as conn:
            conn.sendall(b"ping")
            print(target, conn.recv(16).decode() or "closed")
    except OSError as exc:
        print(target, "refused" if isinstance(exc, ConnectionRefusedError) else f"failed {exc}")
"""


@contextlib.asynccontextmanager
async def echo_server(host: str) -> AsyncIterator[int]:
    """A TCP server of the test's own on `host` that answers ``echo:<data>``; yields its port."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo:" + await reader.read(4))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, host, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses but loopback ones (eth0's, docker0's…), from ``ip``."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    addresses = [line.split()[3].partition("/")[0] for line in out.splitlines()]
    return [address for address in addresses if not address.startswith("127.")]


async def test_network_none_reaches_its_proxy_port_and_nothing_else(none_task: Task) -> None:
    """A listener of the test's own on all the host's addresses, and a second sandbox's proxy
    port running at the same time: both unreachable; the sandbox's own proxy port answers."""
    sandbox, other = (
        IsolatedSandbox(sandbox_spec(none_task), "network-none"),
        IsolatedSandbox(sandbox_spec(none_task), "network-none-2"),
    )
    address, other_address = await sandbox.host_address(), await other.host_address()
    assert address.startswith("127.") and address != "127.0.0.1" and other_address != address
    async with (
        echo_server(address) as proxy_port,
        echo_server(other_address) as other_port,
        echo_server("0.0.0.0") as host_port,
    ):
        assert listening_ports(address) == [proxy_port]
        async with sandbox, other:
            targets = [f"{address}:{proxy_port}", f"127.0.0.1:{host_port}", f"{address}:{host_port}"]
            targets += [f"{other_address}:{other_port}", f"{address}:{other_port}"]
            targets += [f"{ip}:{host_port}" for ip in _host_addresses()]
            out = await conformance.sh(sandbox, f"python3 -c '{PROBE}' {' '.join(targets)}", env=_env())
            results = dict(line.split(" ", 1) for line in out.strip().splitlines())
            assert results.pop(f"{address}:{proxy_port}") == "echo:ping", out
            assert all(not value.startswith("echo") for value in results.values()), out
            assert len(results) == len(targets) - 1
            other_out = await conformance.sh(
                other, f"python3 -c '{PROBE}' {other_address}:{other_port}", env=_env()
            )
            assert other_out.split() == [f"{other_address}:{other_port}", "echo:ping"], other_out
            async with sandbox.egress() as egress_env:  # an installer's way out: CONNECT only
                proxy = egress_env["HTTPS_PROXY"].removeprefix("http://")
                tunnel = await conformance.sh(
                    sandbox, f"python3 -c '{CONNECT_PROBE}' {proxy} 127.0.0.1:{host_port}", env=_env()
                )
                assert tunnel.strip() == "echo:ping", tunnel
            after = await conformance.sh(sandbox, f"python3 -c '{PROBE}' {proxy}", env=_env())
            assert "echo" not in after, "the egress proxy outlived its context"


CONNECT_PROBE = r"""
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=5) as conn:
    conn.sendall(f"CONNECT {sys.argv[2]} HTTP/1.1\r\nHost: {sys.argv[2]}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += conn.recv(1)
    assert b" 200 " in head, head
    conn.sendall(b"ping")
    print(conn.recv(16).decode())
"""


def _env() -> dict[str, str]:
    return {"PATH": f"{Path(sys.base_prefix) / 'bin'}:/usr/bin:/bin"}


def _namespace_members(pid_namespace: str) -> list[int]:
    """Host pids of the processes in PID namespace `pid_namespace` (``pid:[inode]``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "pid") == pid_namespace:
                    members.append(int(entry.name))
    return members


async def test_every_process_dies_with_the_sandbox_and_the_folder_goes(task: Task) -> None:
    sandbox = IsolatedSandbox(sandbox_spec(task), "die-with-it")
    await sandbox.start()
    try:
        await conformance.sh(sandbox, "setsid sh -c 'sleep 600 & sleep 600' >/dev/null 2>&1 &", user="agent")
        ps = await conformance.sh(sandbox, "ps -eo user=,comm=")
        assert "agent" in ps and "sleep" in ps, ps
        assert "reroll" not in ps.replace("reroll-sidecar", ""), f"host processes are visible: {ps}"
        assert (await conformance.sh(sandbox, "hostname")).strip() == SANDBOX_HOSTNAME
        root_options = await conformance.sh(sandbox, "awk '$2 == \"/\" {print $4}' /proc/mounts")
        assert "nosuid" in root_options.split(","), root_options
        sockets = await conformance.sh(sandbox, "ls /var/run/docker.sock /run/containerd 2>&1 || true")
        assert sockets.count("No such file") == 2, f"the host's sockets are visible: {sockets}"
        init = sandbox.init_pid
        namespace = os.readlink(f"/proc/{init}/ns/pid")
        assert len(_namespace_members(namespace)) >= 4
    finally:
        await sandbox.stop()
    for _ in range(50):
        if not _namespace_members(namespace):
            break
        await asyncio.sleep(0.1)
    assert _namespace_members(namespace) == [], "a process of the sandbox survived stop"
    assert not sandbox.folder.exists()


def test_where_namespaces_are_forbidden_local_falls_back_to_plain_and_says_so_once(
    task: Task, none_task: Task, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(backend, "namespaces_unavailable", lambda: "unshare: Operation not permitted")
    warn_once.cache_clear()
    sandboxes = [
        local_sandbox(sandbox_spec(task), "fallback-1"),
        local_sandbox(sandbox_spec(task), "fallback-2"),
    ]
    assert all(type(sandbox) is LocalSandbox for sandbox in sandboxes)
    err = capsys.readouterr().err
    assert err.count("cannot isolate here (unshare: Operation not permitted)") == 1, err
    with pytest.raises(SandboxError, match="network none needs the isolated local sandbox"):
        local_sandbox(sandbox_spec(none_task), "fallback-none")
    for sandbox in sandboxes:
        assert isinstance(sandbox, LocalSandbox)
        os.rmdir(sandbox.root)


def test_local_is_isolated_where_namespaces_work(task: Task) -> None:
    sandbox = local_sandbox(sandbox_spec(task), "isolated")
    assert isinstance(sandbox, IsolatedSandbox)
    os.rmdir(sandbox.folder)


CONTROLLER = r"""
import asyncio, sys
from pathlib import Path
from reroll.sandbox.local.identity import SLOT_ID_START
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.tasks.task import load_task

async def main():
    sandbox = IsolatedSandbox(sandbox_spec(load_task(Path(sys.argv[1]))), "killed-controller")
    await sandbox.start()
    await sandbox.exec(["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 &"], user="agent")
    print(sandbox.init_pid, sandbox.folder, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_killed_controller_takes_the_sandboxs_processes_with_it(task: Task) -> None:
    """SIGKILL of the controller: ``unshare`` dies (parent-death signal), its ``--kill-child``
    kills the sandbox's PID 1, and the kernel every process of the namespace."""
    folder = ""
    with subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(task.path)], stdout=subprocess.PIPE, text=True
    ) as controller:
        try:
            assert controller.stdout is not None
            init_pid, folder = controller.stdout.readline().split()
            namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
            assert len(_namespace_members(namespace)) >= 3  # PID 1, the sidecar, the sleep
            controller.kill()
            controller.wait(timeout=30)
            for _ in range(100):
                if not _namespace_members(namespace):
                    break
                time.sleep(0.1)
            assert _namespace_members(namespace) == [], "a process of the sandbox outlived its controller"
        finally:
            controller.kill()
            shutil.rmtree(folder, ignore_errors=True)


async def test_network_full_reaches_out_but_not_the_host_loopback_nor_other_proxies(task: Task) -> None:
    """pasta gives outbound access; the host's loopback listeners and a second sandbox's proxy
    port stay unreachable; the sandbox's own proxy port answers (forwarded as for ``none``)."""
    full = with_network(task, "full")
    sandbox, other = (
        IsolatedSandbox(sandbox_spec(full), "network-full"),
        IsolatedSandbox(sandbox_spec(full), "network-full-2"),
    )
    address, other_address = await sandbox.host_address(), await other.host_address()
    async with (
        echo_server(address) as proxy_port,
        echo_server(other_address) as other_port,
        echo_server("127.0.0.1") as host_port,
        sandbox,
        other,
    ):
        targets = [f"{address}:{proxy_port}", f"127.0.0.1:{host_port}", f"{other_address}:{other_port}"]
        out = await conformance.sh(sandbox, f"python3 -c '{PROBE}' {' '.join(targets)}", env=_env())
        results = dict(line.split(" ", 1) for line in out.strip().splitlines())
        assert results[f"{address}:{proxy_port}"] == "echo:ping", out
        assert not results[f"127.0.0.1:{host_port}"].startswith("echo"), out
        assert not results[f"{other_address}:{other_port}"].startswith("echo"), out
        if _reachable_from_host("pypi.org", 443):  # the machine has a way out: so has the sandbox
            connect = "import socket; socket.create_connection(('pypi.org', 443), timeout=10); print('ok')"
            assert (await conformance.sh(sandbox, f'python3 -c "{connect}"', env=_env())).strip() == "ok"
        pasta = sandbox._pasta_pid
    assert pasta is not None
    for _ in range(100):  # killed; init reaps it
        if not Path(f"/proc/{pasta}").exists():
            break
        await asyncio.sleep(0.02)
    assert not Path(f"/proc/{pasta}").exists(), "pasta outlived its sandbox"


def _reachable_from_host(host: str, port: int) -> bool:
    """Whether the host itself can connect to `host`:`port` (the machine has a way out)."""
    import socket

    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True


async def test_root_inside_is_an_unprivileged_host_user_in_a_view_of_its_own(task: Task) -> None:
    """The sidecar's root (the verifier's) maps to a host range of its own; it cannot write the kernel's
    core_pattern, mount, write the agents folder or see the host's checkout, /root or /work."""
    checkout = Path(__file__).resolve().parents[3]
    script = f"""
cat /proc/self/uid_map
(echo x > /proc/sys/kernel/core_pattern) 2>/dev/null && echo core_pattern-written
mount -t tmpfs t /mnt 2>/dev/null && echo mounted
mount -o remount,rw "$AGENTS" 2>/dev/null && echo remounted
touch "$AGENTS/planted" 2>/dev/null && echo agents-written
for p in {checkout} /root/.pyenv /work /srv "$HOST_HOME/.gitconfig"; do [ -e "$p" ] && echo "sees $p"; done
stat -c '%u' /app
true
"""
    async with IsolatedSandbox(sandbox_spec(task), "root-view") as sandbox:
        env = {**_env(), "AGENTS": sandbox.layout.agents_dir, "HOST_HOME": str(Path.home())}
        out = await conformance.sh(sandbox, script, env=env)
        host_owner, base = sandbox._files("app").stat().st_uid, sandbox.id_base
    lines = out.split("\n")
    assert lines[0].split() == ["0", str(base), "65536"] and base >= SLOT_ID_START, out
    assert not any(word in out for word in ("written", "mounted", "remounted", "sees ")), out
    assert lines[-2] == "1000" and host_owner == base + 1000, out  # the agent's workspace, mapped
    assert not (Path(sandbox.layout.agents_dir) / "planted").exists()


async def test_a_start_whose_bwrap_command_crashes_says_how_it_ended(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that dies of a signal before ``bwrap`` reports its child is named by its signal
    and log, not by the empty report (the symptom of the forked children gRPC's fork handlers
    crashed: `reroll.host.forking`)."""

    def crashing(self: RootView, argv: list[str], info_fd: int, block_fd: int) -> list[str]:
        return ["sh", "-c", "echo about to crash >&2; kill -SEGV $$"]

    monkeypatch.setattr(RootView, "command", crashing)
    sandbox = IsolatedSandbox(sandbox_spec(task), "crashes-at-start")
    with pytest.raises(SandboxError) as raised:
        await sandbox.start()
    message = str(raised.value)
    assert "sidecar exited with signal SIGSEGV (11) before it was ready" in message, message
    assert "about to crash" in message
    assert not sandbox.folder.exists()


async def test_a_pasta_killed_by_a_signal_is_named_by_it(
    task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "pasta"
    fake.write_text("#!/bin/sh\nkill -SEGV $$\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sandbox = IsolatedSandbox(sandbox_spec(with_network(task, "full")), "pasta-crashes")
    with pytest.raises(SandboxError, match=r"pasta failed \(exited with signal SIGSEGV \(11\)\)"):
        await sandbox.start()
    assert not sandbox.folder.exists()


def test_prune_removes_the_disks_of_killed_controllers_only() -> None:
    """A killed controller leaves its local sandbox's sized file system mounted: ``reroll sandbox
    prune`` unmounts and deletes it; a live controller's, and docker's, stay."""
    dead_owner = f"{socket.gethostname()}/999999/1"
    dead = SizedDisk.create("prune-dead-0001", 8 << 20, {}, dead_owner, prefix=LOCAL_PREFIX)
    live = SizedDisk.create("prune-live-0001", 8 << 20, {}, owner_label(), prefix=LOCAL_PREFIX)
    dockers = SizedDisk.create("prune-dock-0001", 8 << 20, {}, dead_owner)
    try:
        report = local_sandbox.prune(IsolatedSandboxConfig())
        assert str(dead.folder) in report["disks"] and not dead.folder.exists()
        assert str(live.folder) not in report["disks"] and os.path.ismount(live.mountpoint)
        assert os.path.ismount(dockers.mountpoint)
        assert str(live.folder) in local_sandbox.prune(IsolatedSandboxConfig(), "prune-live-0001")["disks"]
    finally:
        for disk in (dead, live, dockers):
            remove_disk(disk.folder)
