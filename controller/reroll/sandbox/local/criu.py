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
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reroll_contracts.errors import SandboxError

from reroll.sandbox.local.criu_install import CriuInstall, ensure_criu

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
        argv = [
            "nsenter", f"--target={init_pid}", *NAMESPACES, "--",
            *criu.argv(*args, *COMMON, "-D", f"/proc/self/fd/{images_fd}", "-o", log_name, root=seen),
        ]  # fmt: skip
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            pass_fds=(install_fd, images_fd),
        )
        output, _ = await process.communicate()
        seconds = time.monotonic() - started
    finally:
        os.close(install_fd)
        os.close(images_fd)
        _own(images, 0)
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
