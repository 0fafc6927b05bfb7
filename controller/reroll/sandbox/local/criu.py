"""A process-level checkpoint of a process tree in an isolated local sandbox, with CRIU
(`reroll.sandbox.local.criu_install`): the agent's memory, for agents that keep their
conversation only there.

`dump_tree` checkpoints the tree rooted at a process of one sandbox into a host folder of images;
`restore_tree` starts it again in another sandbox of the same kind, with the same pids, in that
sandbox's namespaces. CRIU runs in the sandbox's namespaces (user, mount, PID, network, IPC,
UTS: ``nsenter`` from the host, so it holds every capability over the sandbox's namespaces and
none over the host's), with

- ``--unprivileged``: its restore creates sockets with ``SO_SNDBUFFORCE``, which needs
  ``CAP_NET_ADMIN`` in the host's user namespace (the kernel's ``sockopt_capable``); in this mode
  it falls back to ``SO_SNDBUF``;
- ``--manage-cgroups=ignore``: the sandbox has no cgroup file system of its own, and one cannot
  be mounted in its user namespace;
- the sandbox's root as its user (it keeps capabilities across ``execve`` only as the root of
  the user namespace): the images folder is a host folder outside the sandbox's view, mode 0700,
  owned by the sandbox's root while CRIU runs and by the host's root after, reached through an
  inherited file descriptor, as is the CRIU install (read-only to it). No process of the sandbox
  can reach it meanwhile: CRIU's ``/proc/PID/fd`` needs ptrace access, which the sandbox's
  processes lack over a process holding every capability in their namespaces.

From the host's own namespaces CRIU cannot do it: it dumps the sandbox's mount namespace and
finds bind mounts of the sandbox's file system with no mount of its root (``mnt: ... doesn't
have a proper root mount``), and reading a sandbox process's rlimits needs ``CAP_SYS_RESOURCE``
over the sandbox's user namespace, which the host's root on reroll's machines lacks
(``Can't get rlimit 0: Operation not permitted``). docs/branch.md has the measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reroll_contracts.errors import SandboxError

from reroll.sandbox.local.criu_install import CriuInstall, ensure_criu
from reroll.sandbox.local.rootview import AGENT_ID

NAMESPACES = ("--user", "--mount", "--pid", "--net", "--ipc", "--uts")
COMMON = ("--unprivileged", "--manage-cgroups=ignore", "-v2")
LOG_TAIL_CHARS = 2000
FIRST_TREE_PID = 100_000
"""Where `raise_next_pid` puts a sandbox's pids before the tree to checkpoint starts."""


@dataclass(frozen=True)
class CriuRun:
    """One CRIU command's outcome: its wall time in seconds and its log's end."""

    seconds: float
    log: str


class Target(Protocol):
    """The sandbox CRIU runs in (`reroll.sandbox.local.isolated.IsolatedSandbox`)."""

    label: str
    id_base: int
    """The host uid and gid of the sandbox's root."""

    @property
    def init_pid(self) -> int | None:
        """The host pid of the sandbox's PID 1 while it runs."""


def _own(folder: Path, owner: int) -> None:
    """Give `folder` and what it holds (no link followed) to the host uid and gid `owner`."""
    for path in (folder, *folder.iterdir()):
        os.chown(path, owner, owner, follow_symlinks=False)


def _log_tail(images: Path, name: str) -> str:
    try:
        return (images / name).read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return ""


@contextlib.asynccontextmanager
async def _criu_command(
    sandbox: Target, images: Path, args: list[str], log_name: str
) -> AsyncIterator[tuple[list[str], tuple[int, int]]]:
    """The argv that runs ``criu ARGS -D IMAGES`` in `sandbox`'s namespaces as its root, and the
    file descriptors its process inherits (the install's and `images`'), valid while the context
    lasts: `images` (made 0700 when missing) is the sandbox root's meanwhile, the host root's after.

    Raises:
        SandboxError: the sandbox is not running, or CRIU cannot be installed.
    """
    criu: CriuInstall = ensure_criu()
    init_pid = sandbox.init_pid
    if init_pid is None:
        raise SandboxError(f"{sandbox.label} is not running: nothing to checkpoint or restore into")
    images.mkdir(mode=0o700, parents=True, exist_ok=True)
    _own(images, sandbox.id_base)
    install_fd = os.open(criu.root, os.O_PATH | os.O_DIRECTORY)
    images_fd = os.open(images, os.O_PATH | os.O_DIRECTORY)
    try:
        seen = Path(f"/proc/self/fd/{install_fd}")
        yield [
            "nsenter", f"--target={init_pid}", *NAMESPACES, "--",
            *criu.argv(*args, *COMMON, "-D", f"/proc/self/fd/{images_fd}", "-o", log_name, root=seen),
        ], (install_fd, images_fd)  # fmt: skip
    finally:
        os.close(install_fd)
        os.close(images_fd)
        _own(images, 0)


async def run_criu(sandbox: Target, images: Path, args: list[str], log_name: str) -> CriuRun:
    """Run ``criu ARGS -D IMAGES`` in `sandbox`'s namespaces as its root.

    Args:
        sandbox: the running sandbox.
        images: a host folder (made 0700 here when missing; owned by the host's root again
            after) for CRIU's images and its log.
        args: CRIU's action and options (``--unprivileged`` and the cgroup mode added).
        log_name: the log file's name in `images`.

    Returns:
        Its wall time and its log's end.

    Raises:
        SandboxError: CRIU failed (the message quotes its log's end) or cannot be installed.
    """
    async with _criu_command(sandbox, images, args, log_name) as (argv, fds):
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            pass_fds=fds,
        )
        output, _ = await process.communicate()
        seconds = time.monotonic() - started
    log = _log_tail(images, log_name)
    if process.returncode != 0:
        said = output.decode(errors="replace")[-LOG_TAIL_CHARS:]
        raise SandboxError(f"criu {args[0]} failed (exit {process.returncode}): {said}\n{log}")
    return CriuRun(seconds, log)


async def raise_next_pid(sandbox: Target, last: int = FIRST_TREE_PID - 1) -> None:
    """Make the next process of `sandbox` take pid ``last + 1`` (the PID namespace's
    ``ns_last_pid``, written from inside it), so that the tree started next has pids a fresh
    sandbox does not use: `restore_tree` needs each of them free in the sandbox it restores into,
    whose sidecar's threads and commands take the low ones.

    Raises:
        SandboxError: the sandbox is not running, or the write failed.
    """
    if sandbox.init_pid is None:
        raise SandboxError(f"{sandbox.label} is not running")
    process = await asyncio.create_subprocess_exec(
        "nsenter", f"--target={sandbox.init_pid}", "--pid", "--",
        "sh", "-c", 'echo "$1" > /proc/sys/kernel/ns_last_pid', "sh", str(last),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    if process.returncode != 0:
        raise SandboxError(f"{sandbox.label}: cannot set its next pid: {output.decode(errors='replace')}")


async def dump_tree(sandbox: Target, pid: int, images: Path, *, leave_running: bool = True) -> CriuRun:
    """Checkpoint the process tree rooted at `pid` (its pid inside the sandbox) into `images`.

    Established TCP connections are dumped (``--tcp-established``) and restored closed (see
    `restore_tree`); with `leave_running` the tree goes on running after the dump, else it is killed.

    Raises:
        SandboxError: as `run_criu`.
    """
    args = ["dump", "-t", str(pid), "--tcp-established", "--file-locks"]
    if leave_running:
        args.append("--leave-running")
    return await run_criu(sandbox, images, args, "dump.log")


async def restore_tree(sandbox: Target, images: Path) -> CriuRun:
    """Start the process tree checkpointed in `images` in `sandbox`,
    with its pids (free in a fresh sandbox), detached (its root's parent becomes the sandbox's
    PID 1); its TCP connections closed (``--tcp-close``: a request in flight fails, and an HTTP
    client that retries sends it again).

    Raises:
        SandboxError: as `run_criu` (e.g. a pid of the tree is taken in this sandbox).
    """
    args = ["restore", "-d", "--tcp-close", "--file-locks"]
    return await run_criu(sandbox, images, args, "restore.log")


@dataclass(frozen=True)
class Tree:
    """A process tree of a sandbox as `find_tree` saw it (pids inside the sandbox)."""

    root: int
    pipes: dict[int, str]
    """The root's standard output and error (1, 2) that are pipes, as ``pipe:[INODE]``: the
    ends its restore is handed (`restore_attached`'s `inherit`)."""
    open_files: list[str]
    """The regular files the tree's processes hold open (paths inside the sandbox, sorted): their
    size at the dump must be theirs at the restore."""


def _status(host_pid: str) -> dict[str, str]:
    lines = Path(f"/proc/{host_pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def find_tree(sandbox: Target, uid: int) -> Tree:
    """The tree rooted at the oldest session leader of host uid `uid` started after
    `raise_next_pid` in `sandbox` (its pid >= `FIRST_TREE_PID`), read from the host's ``/proc``
    (no process of the sandbox runs for it, no link of the agent's followed: ``readlink`` only).

    Raises:
        SandboxError: the sandbox is not running, or no such process runs in it.
    """
    init_pid = sandbox.init_pid
    if init_pid is None:
        raise SandboxError(f"{sandbox.label} is not running")
    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    inner: dict[str, int] = {}
    parents: dict[str, str] = {}
    leaders: list[tuple[int, str]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") != namespace:
                continue
            status = _status(entry.name)
            session = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()[3]
        except OSError:  # gone meanwhile
            continue
        pid = int(status["NSpid"].split()[-1])
        inner[entry.name], parents[entry.name] = pid, status["PPid"]
        if pid >= FIRST_TREE_PID and session == entry.name and int(status["Uid"].split()[0]) == uid:
            leaders.append((pid, entry.name))
    if not leaders:
        raise SandboxError(f"{sandbox.label}: no process tree of uid {uid} started after raise_next_pid")
    root_pid, root = min(leaders)
    members = [host for host in inner if _descends(host, root, parents)]
    pipes = {fd: link for fd in (1, 2) if (link := _link(root, fd)).startswith("pipe:")}
    return Tree(root_pid, pipes, sorted({path for host in members for path in _open_files(host)}))


def _descends(host: str, root: str, parents: dict[str, str]) -> bool:
    while host in parents:
        if host == root:
            return True
        host = parents[host]
    return False


def _link(host: str, fd: int | str) -> str:
    try:
        return os.readlink(f"/proc/{host}/fd/{fd}")
    except OSError:
        return ""


def _open_files(host: str) -> list[str]:
    """The regular files process `host` holds open (its ``/proc/PID/fd`` links that name a path)."""
    try:
        fds = os.listdir(f"/proc/{host}/fd")
    except OSError:
        return []
    found = []
    for fd in fds:
        link = _link(host, fd)
        try:
            regular = link.startswith("/") and stat.S_ISREG(os.stat(f"/proc/{host}/fd/{fd}").st_mode)
        except OSError:
            continue
        if regular and not link.endswith(" (deleted)"):
            found.append(link)
    return found


async def restore_attached(
    sandbox: Target,
    images: Path,
    inherit: dict[int, str],
    on_output: Callable[[str, bytes], None],
    timeout_seconds: float,
) -> tuple[int, bool]:
    """Restore the tree checkpointed in `images` in `sandbox` and wait for its root to exit
    (``criu restore`` without ``-d``), its TCP connections closed as in `restore_tree`.

    Args:
        inherit: the tree's pipes to hand the restore's own standard output and error, by the
            descriptor (1, 2) that takes each (`Tree.pipes`: ``--inherit-fd``); what the tree
            writes there goes to `on_output` (``stdout``/``stderr``, a chunk).
        timeout_seconds: after it, CRIU (and with it the wait) is killed; the tree is the
            caller's to kill (`Sandbox.kill`).

    Returns:
        CRIU's exit code and whether it timed out. CRIU 4.2 only waits for the root: it exits 0
        whatever the root's exit status (a restored agent's own code is not known).

    Raises:
        SandboxError: the restore failed (CRIU's log's end in the message).
    """
    args = ["restore", "--tcp-close", "--file-locks"]
    args += [f"--inherit-fd=fd[{fd}]:{link}" for fd, link in sorted(inherit.items())]
    pipes = [os.pipe(), os.pipe()]  # (read, write): the restore's stdout and stderr
    try:
        for _, write in pipes:  # the restored tree reopens them (/proc/self/fd/N) as the agent
            os.fchown(write, sandbox.id_base + AGENT_ID, sandbox.id_base + AGENT_ID)
        async with _criu_command(sandbox, images, args, "restore.log") as (argv, fds):
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=pipes[0][1], stderr=pipes[1][1], pass_fds=fds
            )
            for _, write in pipes:
                os.close(write)
            pipes = [(read, -1) for read, _ in pipes]
            code, timed_out = await _wait_pumping(
                process, [read for read, _ in pipes], on_output, timeout_seconds
            )
            pipes = []  # their reading ends closed by the pumps
    finally:
        for read, write in pipes:
            for fd in (read, write):
                if fd >= 0:
                    os.close(fd)
    log = _log_tail(images, "restore.log")
    if "Restoring FAILED" in log:  # CRIU gave up: the tree did not come back
        raise SandboxError(f"criu restore failed (exit {code}):\n{log}")
    return code, timed_out


async def _wait_pumping(
    process: asyncio.subprocess.Process,
    reads: list[int],
    on_output: Callable[[str, bytes], None],
    timeout_seconds: float,
) -> tuple[int, bool]:
    """Wait for `process` (killed after `timeout_seconds`) while its output pipes' reading ends
    `reads` (stdout, stderr; closed here) go to `on_output`. Its exit code, and whether it timed out."""
    loop = asyncio.get_running_loop()

    async def pump(name: str, fd: int) -> None:
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        try:
            while chunk := await reader.read(65536):
                on_output(name, chunk)
        finally:
            transport.close()

    pumps = asyncio.gather(*(pump(name, fd) for name, fd in zip(("stdout", "stderr"), reads, strict=True)))
    try:
        await asyncio.wait_for(asyncio.shield(pumps), timeout_seconds)
        return await process.wait(), False
    except TimeoutError:
        process.kill()
        return await process.wait(), True
    finally:
        pumps.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumps
