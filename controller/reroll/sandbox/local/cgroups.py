"""Resource limits of the isolated `local` sandbox: its cgroup, and the sizes of its RAM-backed file systems.

The task's ``environment.memory_mb`` (swap included: none beyond it), ``cpus`` and ``pids_max``
(defaults 2048 MiB, 1 core, 1024: `reroll.sandbox.spec.ResourceLimits`) are enforced by a cgroup
made by the controller (root) on the host for each sandbox — the same kernel limits Docker sets
on a container. Its whole process tree starts in it: `SandboxCgroup.enter_command` prefixes the
sandbox's command with a tiny ``sh`` that writes its own pid into the group before it execs
``unshare``, so no process of the sandbox ever runs outside it. `SandboxCgroup.remove` kills
whatever is left in it and deletes it.

Both cgroup versions (Linux's Documentation/admin-guide/cgroup-v1 and cgroup-v2):

- v2 (the unified hierarchy, what systemd machines mount at ``/sys/fs/cgroup``): the group is
  ``<mount>/reroll/<name>`` with ``memory.max``, ``memory.swap.max = 0``, ``cpu.max`` and
  ``pids.max``; the controllers are enabled in the root's and ``reroll``'s
  ``cgroup.subtree_control`` (the root is the one non-leaf group allowed to hold processes, so
  the group is not made under the controller's own);
- v1 (one hierarchy per controller, or a "hybrid" machine whose cgroup2 mount has no memory
  controller): ``<memory mount>/reroll/<name>`` with ``memory.limit_in_bytes`` and
  ``memory.memsw.limit_in_bytes`` (where swap is accounted), ``<cpu mount>/reroll/<name>`` with
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``<pids mount>/reroll/<name>`` with ``pids.max``.

`detect` reads ``/proc/self/mountinfo`` to choose: v2 when the cgroup2 mount's root offers the
memory controller, else v1. A limit hit is read back by `SandboxCgroup.limits_hit`: the OOM
killer's ``oom_kill`` count (``memory.oom_control`` in v1, ``memory.events`` in v2) and the
``max`` count of ``pids.events`` (a fork refused at ``pids_max``). CPU is throttled, never "hit".

File systems: what the sandbox writes (workspace, logs, home, ``/tmp``) goes to a sized file
system on disk of ``storage_mb`` (`reroll.sandbox.local.isolated`). ``/dev/shm`` lives in RAM, and
the kernel charges its pages to the memory cgroup of the process that wrote them: it is sized
below the memory limit (`SandboxLimits.of`: `SHM_MB`, Docker's default, at most a quarter of
``memory_mb``) so that filling it is ``ENOSPC`` to the writer — reported as a storage limit
(`full_filesystems`) — instead of an OOM kill of whichever process is largest (often the sidecar).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from reroll_contracts.errors import SandboxError

from reroll.sandbox.spec import ResourceLimits

PARENT = "reroll"
"""Every sandbox's group is ``<hierarchy>/reroll/<name>``."""
CONTROLLERS = ("memory", "cpu", "pids")
"""The controllers a sandbox's group needs."""
CPU_PERIOD_US = 100_000
"""The CFS period of ``cpus``: a sandbox may run ``cpus * 100 ms`` of CPU time every 100 ms."""
MIN_CPU_QUOTA_US = 1000
"""The kernel's smallest CFS quota (1 ms)."""
SHM_MB = 64
"""Size of ``/dev/shm`` in MiB (Docker's default ``--shm-size``), at most a quarter of ``memory_mb``."""
FULL_BELOW_BYTES = 1 << 20
"""A file system with less than this free counts as full (`full_filesystems`)."""
REMOVE_TIMEOUT_SECONDS = 10.0
ENTER_SCRIPT = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
"""``sh -c`` program of `SandboxCgroup.enter_command`: write its own pid into every file named
before ``--``, then exec what follows (exit 125 when a write fails, sh names the file)."""

logger = logging.getLogger(__name__)


class CgroupError(SandboxError):
    """No cgroup can be made here (no cgroup file system, a controller missing, not root)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What a sandbox may use, from its task's ``environment``."""

    memory_bytes: int
    """RAM plus swap, in bytes (``memory_mb``)."""
    cpus: float
    """CPU time in cores (``cpus``)."""
    pids_max: int
    """Processes and threads at once (``pids_max``)."""
    shm_bytes: int
    """Size in bytes of ``/dev/shm``."""
    storage_mb: int = 0
    """The task's ``storage_mb``: the size of the sandbox's writable file system, MiB."""

    @classmethod
    def of(cls, environment: ResourceLimits) -> SandboxLimits:
        """The limits a sandbox's spec holds (`environment`, the task's ``environment``'s); see
        the module docstring for ``/dev/shm``'s size."""
        memory = environment.memory_mb << 20
        return cls(
            memory_bytes=memory,
            cpus=environment.cpus,
            pids_max=environment.pids_max,
            shm_bytes=min(SHM_MB << 20, memory // 4),
            storage_mb=environment.storage_mb,
        )


@dataclass(frozen=True)
class CgroupLayout:
    """Where this machine's cgroup hierarchies are mounted."""

    version: int
    """2: the unified hierarchy holds the controllers; 1: one hierarchy per controller."""
    mounts: dict[str, Path] = field(default_factory=dict)
    """v1: controller name → its hierarchy's mount point; v2: ``{"": mount point}``."""

    def group_paths(self, name: str) -> dict[str, Path]:
        """The folders of the sandbox group `name`: controller → folder (v2: one, under key "")."""
        return {controller: mount / PARENT / name for controller, mount in self.mounts.items()}


def parse_mountinfo(text: str) -> tuple[dict[str, Path], Path | None]:
    """The cgroup mounts in a ``/proc/self/mountinfo`` `text` (proc(5)): v1 controller name →
    mount point (a hierarchy holding several, ``cpu,cpuacct``, is listed under each) and the
    cgroup2 mount point (None when there is none). The first mount of a hierarchy wins."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 4 or dash < 5:
            continue
        mount_point = Path(fields[4].replace("\\040", " "))
        fstype, options = fields[dash + 1], fields[dash + 3].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for option in options:
                if option in CONTROLLERS:
                    v1.setdefault(option, mount_point)
    return v1, v2


def detect(mountinfo: str | None = None) -> CgroupLayout:
    """This machine's cgroup layout: v2 when the cgroup2 mount offers the memory controller
    (``cgroup.controllers`` of its root), else v1 with a hierarchy for each of `CONTROLLERS`.

    Args:
        mountinfo: the text of ``/proc/self/mountinfo`` (default: read it).

    Raises:
        CgroupError: neither holds every controller a sandbox needs (the message says which are
            missing where).
    """
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError as exc:
            raise CgroupError(f"cannot read /proc/self/mountinfo: {exc}") from exc
    v1, v2 = parse_mountinfo(mountinfo)
    if v2 is not None:
        try:
            offered = set((v2 / "cgroup.controllers").read_text().split())
        except OSError:
            offered = set()
        if "memory" in offered:
            missing = [name for name in CONTROLLERS if name not in offered]
            if missing:
                raise CgroupError(f"the cgroup2 hierarchy at {v2} lacks the controllers {', '.join(missing)}")
            return CgroupLayout(2, {"": v2})
    if v1:
        missing = [name for name in CONTROLLERS if name not in v1]
        if missing:
            raise CgroupError(f"no cgroup v1 hierarchy holds the controllers {', '.join(missing)}")
        return CgroupLayout(1, {name: v1[name] for name in CONTROLLERS})
    raise CgroupError("no cgroup hierarchy with the memory controller is mounted (see /proc/self/mountinfo)")


def _write(path: Path, value: str) -> None:
    """Write `value` into the cgroup file `path`.

    Raises:
        CgroupError: the kernel refused it (the file and the cause named).
    """
    try:
        with open(path, "w") as out:
            out.write(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} into {path}: {exc.strerror or exc}") from exc


def _counter(path: Path, name: str) -> int:
    """The value of counter `name` in a flat-keyed cgroup file (``name value`` lines); 0 when
    the file or the counter is missing."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return 0


def _enable_controllers(group: Path) -> None:
    """v2: enable `CONTROLLERS` for the children of `group` (``cgroup.subtree_control``).

    Raises:
        CgroupError: refused (e.g. `group` is not the root and holds processes).
    """
    enabled = set((group / "cgroup.subtree_control").read_text().split())
    wanted = [f"+{name}" for name in CONTROLLERS if name not in enabled]
    if wanted:
        _write(group / "cgroup.subtree_control", " ".join(wanted))


@dataclass
class SandboxCgroup:
    """One sandbox's cgroup (a folder in each v1 hierarchy, or one in v2); see the module docstring."""

    layout: CgroupLayout
    name: str
    limits: SandboxLimits

    @property
    def paths(self) -> dict[str, Path]:
        """Controller → the group's folder (v2: one folder, under key "")."""
        return self.layout.group_paths(self.name)

    def _file(self, controller: str, name: str) -> Path:
        """The group's interface file `name` of `controller`."""
        paths = self.paths
        return paths[""] / name if self.layout.version == 2 else paths[controller] / name

    @classmethod
    def create(cls, name: str, limits: SandboxLimits, layout: CgroupLayout | None = None) -> SandboxCgroup:
        """Make the group `name` (a file name, e.g. the sandbox folder's) and write `limits` into it.

        Args:
            name: the group's name, unique on this host.
            limits: what the sandbox may use.
            layout: where the hierarchies are (default: `detect`).

        Raises:
            CgroupError: no usable hierarchy, not root, or a limit the kernel refused; what
                was made is removed.
        """
        group = cls(layout or detect(), name, limits)
        try:
            group._make()
        except OSError as exc:
            group.remove()
            raise CgroupError(f"cannot make the sandbox's cgroup {name}: {exc}") from exc
        except CgroupError:
            group.remove()
            raise
        return group

    def _make(self) -> None:
        limits = self.limits
        if self.layout.version == 2:
            (root,) = self.layout.mounts.values()
            _enable_controllers(root)
            (root / PARENT).mkdir(exist_ok=True)
            _enable_controllers(root / PARENT)
            self.paths[""].mkdir()
            _write(self._file("memory", "memory.max"), str(limits.memory_bytes))
            if self._file("memory", "memory.swap.max").exists():
                _write(self._file("memory", "memory.swap.max"), "0")
            quota = max(MIN_CPU_QUOTA_US, round(limits.cpus * CPU_PERIOD_US))
            _write(self._file("cpu", "cpu.max"), f"{quota} {CPU_PERIOD_US}")
            _write(self._file("pids", "pids.max"), str(limits.pids_max))
            return
        for path in self.paths.values():
            path.parent.mkdir(exist_ok=True)
            path.mkdir()
        _write(self._file("memory", "memory.limit_in_bytes"), str(limits.memory_bytes))
        if self._file("memory", "memory.memsw.limit_in_bytes").exists():  # swap accounting on
            _write(self._file("memory", "memory.memsw.limit_in_bytes"), str(limits.memory_bytes))
        _write(self._file("cpu", "cpu.cfs_period_us"), str(CPU_PERIOD_US))
        quota = max(MIN_CPU_QUOTA_US, round(limits.cpus * CPU_PERIOD_US))
        _write(self._file("cpu", "cpu.cfs_quota_us"), str(quota))
        _write(self._file("pids", "pids.max"), str(limits.pids_max))

    @property
    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a process writes its pid into to join the group (one per
        hierarchy)."""
        return sorted({path / "cgroup.procs" for path in self.paths.values()})

    def enter_command(self, argv: list[str]) -> list[str]:
        """`argv` prefixed so that it runs in this group from its first instruction on: ``sh``
        writes its own pid into `procs_files`, then execs `argv` (exit 125 when it cannot)."""
        return ["sh", "-c", ENTER_SCRIPT, "reroll-cgroup-enter", *map(str, self.procs_files), "--", *argv]

    def add(self, pid: int) -> None:
        """Move process `pid` (host pid) into the group.

        Raises:
            CgroupError: the kernel refused (the process is gone, or the group is).
        """
        for procs in self.procs_files:
            _write(procs, str(pid))

    def pids(self) -> set[int]:
        """The host pids of the processes in the group (empty once it is removed)."""
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                found |= {int(pid) for pid in procs.read_text().split()}
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer ended in the group so far."""
        if self.layout.version == 2:
            return _counter(self._file("memory", "memory.events"), "oom_kill")
        return _counter(self._file("memory", "memory.oom_control"), "oom_kill")

    def pids_refused(self) -> int:
        """How many forks (or new threads) the group refused at ``pids_max`` so far."""
        return _counter(self._file("pids", "pids.events"), "max")

    def limits_hit(self) -> list[str]:
        """The group's limits its processes hit so far, each a sentence naming the limit and the
        task's field (memory: the OOM killer struck; pids: a fork was refused); empty: none."""
        hit = []
        kills = self.oom_kills()
        if kills:
            hit.append(
                f"out of memory: the kernel killed {kills} process(es) at the sandbox's limit of "
                f"{self.limits.memory_bytes >> 20} MiB (the task's environment.memory_mb)"
            )
        refused = self.pids_refused()
        if refused:
            hit.append(
                f"out of processes: {refused} fork(s) refused at the sandbox's limit of "
                f"{self.limits.pids_max} processes and threads (the task's environment.pids_max)"
            )
        return hit

    def remove(self, timeout_seconds: float = REMOVE_TIMEOUT_SECONDS) -> None:
        """Kill every process left in the group (SIGKILL; v2's ``cgroup.kill`` where the kernel
        has it) and delete its folders; never raises. A group the kernel keeps busy past
        `timeout_seconds` is left behind (empty groups cost nothing) and logged."""
        paths = [path for path in self.paths.values() if path.is_dir()]
        if not paths:
            return
        kill_file = self._file("", "cgroup.kill") if self.layout.version == 2 else None
        deadline = time.monotonic() + timeout_seconds
        while True:
            if kill_file is not None and kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for path in list(paths):
                try:
                    path.rmdir()
                    paths.remove(path)
                except FileNotFoundError:
                    paths.remove(path)
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        paths.remove(path)
            if not paths or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if paths:
            logger.warning("cgroups %s still busy after %.0f s, left behind", paths, timeout_seconds)


def full_filesystems(root: Path, mounts: dict[str, str]) -> list[str]:
    """Which of the sandbox's sized file systems are full (less than `FULL_BELOW_BYTES` free).

    Args:
        root: the sandbox's root seen from the host (``/proc/<its PID 1>/root``).
        mounts: path inside the sandbox → what the message says of it (its size, the task's field).

    Returns:
        One sentence per full file system; empty when none is (or the sandbox is gone).
    """
    full = []
    for path, what in mounts.items():
        try:
            stat = os.statvfs(root / path.lstrip("/"))
        except OSError:
            continue
        if stat.f_bavail * stat.f_frsize < FULL_BELOW_BYTES:
            full.append(f"out of storage: {path} is full ({what})")
    return full
