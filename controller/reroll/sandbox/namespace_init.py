"""PID 1 of an isolated local sandbox: build its root file system, then run and reap the sidecar.

Started by `reroll.sandbox.isolated` through util-linux ``unshare`` in fresh mount, PID, IPC and
UTS namespaces (and a network namespace for policy ``none``), as ``python -m
reroll.sandbox.namespace_init SPEC_JSON -- SIDECAR_ARGV…``. It then, still seeing the host's
file system:

1. mounts a tmpfs (``size`` = `NamespaceSpec.upper_size_bytes`) holding the overlay's upper and
   work folders — a file system apart from the lower one, since overlayfs does not support an
   upper layer inside a lower layer (the kernel's overlayfs.rst) — and the overlay (lower: the
   host's ``/``, read-only through it) on ``merged``; tmpfs pages live in RAM (or swap);
   the lower layer is the root file system alone: the host's other mounts (``/var/lib/docker``,
   ``/proc``…) are not in it;
2. binds the sandbox's host folders (`NamespaceSpec.binds`: workspace, logs, verifier, agents,
   the sidecar's control folder) into it, gives it a fresh ``/proc`` (this PID namespace), a
   minimal ``/dev`` (null, zero, full, random, urandom, tty, its own pts and shm, the latter of
   `NamespaceSpec.shm_size_bytes`), a read-only ``/sys``, a private ``/tmp`` (a folder of the
   upper layer's tmpfs, sharing its size) and tmpfs ``/run`` (hiding the host's sockets there,
   Docker's included); the upper layer is seen read-only by root at `UPPER_VIEW`;
3. adds the agent's user (`add_agent_user`), brings the loopback interface up (a new network
   namespace starts with it down);
4. makes ``merged`` the root (``pivot_root``; the host's root is detached), forks the sidecar
   and reaps every process until the sidecar exits, then exits with its code: the kernel then
   kills every process left in the PID namespace. SIGTERM and SIGINT are passed to the sidecar.

The spec (`NamespaceSpec`) is the one contract between this program and the controller.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import stat
import struct
import sys
from dataclasses import asdict, dataclass, field

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MNT_DETACH = 0x2
SYS_PIVOT_ROOT = 155
"""x86_64 syscall number of pivot_root (glibc has no wrapper)."""
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
UPPER_VIEW = "/run/reroll-overlay/upper"
"""Where root inside the sandbox sees the overlay's upper layer, read-only: everything the
sandbox wrote outside its bound folders (what a layer snapshot copies; ``scripts/bench/local_sandbox``)."""
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
"""Device nodes bound from the host's ``/dev`` (the ones a container gets)."""


@dataclass(frozen=True)
class Bind:
    """A host folder bound into the sandbox."""

    source: str
    """Absolute host path."""
    target: str
    """Absolute path inside the sandbox."""
    read_only: bool = False
    mode: int = 0o755
    """Mode of the folders created on the way to `target` inside the sandbox."""


@dataclass(frozen=True)
class NamespaceSpec:
    """What `main` builds; passed as JSON on the command line."""

    state_dir: str
    """Host folder (root only) under which the overlay's tmpfs is mounted, in this namespace only."""
    upper_size_bytes: int
    """Size limit of the tmpfs holding everything the sandbox writes outside its bound folders
    (the overlay's upper layer and ``/tmp``)."""
    hostname: str
    network_namespace: bool
    """True: this runs in a new network namespace (policy ``none``): bring its loopback up."""
    binds: list[Bind] = field(default_factory=list)
    agent_user: str = ""
    """A user to add to the overlay's ``/etc/passwd`` and ``/etc/group`` unless it exists (first
    free id from 1000), with HOME ``/home/<agent_user>``; empty: none."""
    agent_owned: list[str] = field(default_factory=list)
    """Paths inside the sandbox handed (recursively) to `agent_user`."""
    shm_size_bytes: int = 0
    """Size limit of ``/dev/shm`` (0: the kernel's default, half the host's RAM)."""
    agent_reachable: list[str] = field(default_factory=list)
    """Paths inside the sandbox whose root-owned parents get ``o+x`` in the overlay, so that
    `agent_user` can reach them (the host's interpreter and agents folder, e.g. under ``/root``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NamespaceSpec:
        data = json.loads(text)
        return cls(**{**data, "binds": [Bind(**bind) for bind in data["binds"]]})


_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2). Raises OSError naming the target."""
    if _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    ):
        code = ctypes.get_errno()
        raise OSError(code, f"mount {fstype or 'bind'} {source} on {target}: {os.strerror(code)}")


def _bind(source: str, target: str, read_only: bool = False, recursive: bool = False) -> None:
    _mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _makedirs(root: str, path: str, mode: int) -> str:
    """Create `path` (absolute, inside the sandbox) below `root`; returns the host-side path."""
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(full, mode=mode, exist_ok=True)
    return full


def _loopback_up() -> None:
    """Set the ``lo`` interface up (ioctl SIOCSIFFLAGS, as ``ip link set lo up``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request + b"\0" * 14)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP) + b"\0" * 14)


def _dev(merged: str, shm_size_bytes: int = 0) -> None:
    dev = os.path.join(merged, "dev")
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k")
    for name in DEVICES:
        open(os.path.join(dev, name), "w").close()  # a mount point
        _bind(f"/dev/{name}", os.path.join(dev, name))
    for sub, fstype, options in (
        ("pts", "devpts", "newinstance,ptmxmode=0666,mode=620"),
        ("shm", "tmpfs", f"mode=1777,size={shm_size_bytes}" if shm_size_bytes else "mode=1777"),
    ):
        os.mkdir(os.path.join(dev, sub))
        _mount(fstype, os.path.join(dev, sub), fstype, MS_NOSUID | MS_NOEXEC, options)
    os.symlink("pts/ptmx", os.path.join(dev, "ptmx"))
    for index, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{index}", os.path.join(dev, name))
    os.symlink("/proc/self/fd", os.path.join(dev, "fd"))


def build_root(spec: NamespaceSpec) -> str:
    """Steps 1 to 3 of the module docstring; returns the new root's path (not yet pivoted to).

    Raises:
        OSError: a mount failed (the message names it).
    """
    layers = os.path.join(spec.state_dir, "overlay")
    os.makedirs(layers, mode=0o700, exist_ok=True)
    _mount("tmpfs", layers, "tmpfs", 0, f"mode=700,size={spec.upper_size_bytes}")
    for sub in ("upper", "work", "merged", "tmp"):
        os.mkdir(os.path.join(layers, sub), 0o755)
    os.chmod(os.path.join(layers, "tmp"), 0o1777)  # /tmp: counted in the same size
    merged = os.path.join(layers, "merged")
    _mount(
        "overlay",
        merged,
        "overlay",
        MS_NOSUID | MS_NODEV,  # the host's set-user-ID programs give the agent nothing
        f"lowerdir=/,upperdir={layers}/upper,workdir={layers}/work",
    )
    _mount("proc", _makedirs(merged, "/proc", 0o555), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _bind("/sys", _makedirs(merged, "/sys", 0o555), read_only=True)
    _dev(merged, spec.shm_size_bytes)
    tmp = _makedirs(merged, "/tmp", 0o1777)
    _bind(os.path.join(layers, "tmp"), tmp)
    _mount("none", tmp, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
    _mount("tmpfs", _makedirs(merged, "/run", 0o755), "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    for bind in spec.binds:
        target = _makedirs(merged, bind.target, bind.mode)
        _bind(bind.source, target, read_only=bind.read_only)
    _bind(os.path.join(layers, "upper"), _makedirs(merged, UPPER_VIEW, 0o700), read_only=True)
    if spec.agent_user:
        add_agent_user(merged, spec)
    if spec.network_namespace:
        _loopback_up()
    if _libc.sethostname(spec.hostname.encode(), len(spec.hostname.encode())):
        raise OSError(ctypes.get_errno(), "sethostname")
    return merged


def _ids_in_use(path: str) -> set[int]:
    with open(path, encoding="utf-8") as lines:
        return {
            int(fields[2])
            for fields in (line.split(":") for line in lines)
            if len(fields) > 2 and fields[2].isdigit()
        }


def add_agent_user(merged: str, spec: NamespaceSpec) -> None:
    """The agent's user, its HOME, ownership and reach (`NamespaceSpec.agent_user` and after),
    written in the overlay below `merged`: the host's files are untouched."""
    etc = os.path.join(merged, "etc")
    user = spec.agent_user
    with open(os.path.join(etc, "passwd"), encoding="utf-8") as lines:
        entry = next((line.split(":") for line in lines if line.split(":")[0] == user), None)
    if entry is None:
        used = _ids_in_use(os.path.join(etc, "passwd")) | _ids_in_use(os.path.join(etc, "group"))
        uid = next(n for n in range(1000, 60000) if n not in used)
        with open(os.path.join(etc, "passwd"), "a", encoding="utf-8") as out:
            out.write(f"{user}:x:{uid}:{uid}::/home/{user}:/bin/sh\n")
        with open(os.path.join(etc, "group"), "a", encoding="utf-8") as out:
            out.write(f"{user}:x:{uid}:\n")
        uid_gid = (uid, uid)
    else:
        uid_gid = (int(entry[2]), int(entry[3]))
    for path in [f"/home/{user}", *spec.agent_owned]:
        top = _makedirs(merged, path, 0o755)
        for folder, dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, item) for item in dirs + files)]:
                os.lchown(name, *uid_gid)
    for path in spec.agent_reachable:
        while path not in ("/", ""):
            full = os.path.join(merged, path.lstrip("/"))
            status = os.stat(full)
            if stat.S_ISDIR(status.st_mode) and status.st_uid == 0 and not status.st_mode & 0o001:
                os.chmod(full, stat.S_IMODE(status.st_mode) | 0o001)
            path = os.path.dirname(path.rstrip("/"))


def pivot(new_root: str) -> None:
    """Make `new_root` the root of this mount namespace and detach the old one."""
    os.chdir(new_root)
    if _libc.syscall(SYS_PIVOT_ROOT, b".", b"."):
        code = ctypes.get_errno()
        raise OSError(code, f"pivot_root {new_root}: {os.strerror(code)}")
    if _libc.umount2(b".", MNT_DETACH):
        code = ctypes.get_errno()
        raise OSError(code, f"detaching the host's root: {os.strerror(code)}")
    os.chdir("/")


def reap_until(child: int) -> int:
    """Reap every process of the namespace until `child` exits; its exit code (128 + signal when killed)."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        if pid == child:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(argv: list[str]) -> int:
    """``namespace_init SPEC_JSON -- ARGV…``: see the module docstring. Exit 2: bad usage or a
    failed mount (the cause on stderr)."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m reroll.sandbox.namespace_init SPEC_JSON -- ARGV...", file=sys.stderr)
        return 2
    spec = NamespaceSpec.from_json(argv[0])
    try:
        pivot(build_root(spec))
    except OSError as exc:
        print(f"reroll isolated sandbox: {exc}", file=sys.stderr)
        return 2
    child = os.fork()
    if child == 0:  # the sidecar: a session of its own, default signal dispositions
        os.setsid()
        try:
            os.execvp(argv[2], argv[2:])
        except OSError as exc:
            print(f"reroll isolated sandbox: cannot run {argv[2]}: {exc}", file=sys.stderr)
            os._exit(127)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError as exc:  # pragma: no cover - gone already
            if exc.errno != errno.ESRCH:
                raise

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    return reap_until(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
