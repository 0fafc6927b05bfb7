"""Fresh namespaces for each verify: what a verify's processes leave dies with them (issue 32).

``reroll-sidecar ns-exec -- ARGV...`` runs ARGV (the test script) in new user, mount, PID, IPC
and UTS namespaces that no process of the agent ever enters:

- user: the same ids (each range of the sidecar's own ``uid_map`` and ``gid_map`` maps to itself:
  root is root, the guard's user is the guard's user) — new only because an unprivileged
  sandbox root may create the others only under a user namespace of its own;
- IPC: SysV shared memory, semaphores and message queues and POSIX message queues start empty
  and are destroyed with the namespace;
- PID: ARGV is its PID 1 (``/proc`` mounted anew where the kernel lets it: not under Docker's
  masked ``/proc``, where the old one stays, listing the container's processes); when it ends,
  the kernel kills every process left in it (a detached daemon included), and a killed launcher
  takes it along (``PDEATHSIG``);
- keyrings: ARGV starts in a fresh, empty session keyring, and ``add_key``, ``request_key`` and
  ``keyctl`` fail with ``EPERM`` for it and everything it starts (a seccomp filter, as Docker's
  default profile does for a whole container): keys are not namespaced (a key the agent opened to
  everyone is readable by id from any user namespace, a keyring the agent opened takes the verify's
  keys and outlives it), so the verify reads no key the agent left and leaves none behind;
- network, only with ``--own-net`` (the verifier's network policy ``none`` is stricter than the
  agent's): a namespace whose one interface is ``lo``, brought up; nothing outside the sandbox is
  reachable, nor the LLM proxy; the ports listening on the sandbox's own loopback (or on all its
  addresses) when the verify starts are relayed to the same ports of the namespace's ``lo``
  (`reroll_sidecar.loopback_relay`): the task's services stay reachable, as in Harbor's verifier;
- mount (private propagation): fresh ``/dev/shm`` (tmpfs) and ``/dev/mqueue``; for a soft verify
  (the agent works on afterwards) fresh ``/tmp`` and ``/var/tmp`` too (empty tmpfs: what the
  verify writes there is gone when it ends). The final verify keeps the sandbox's ``/tmp``, as
  Harbor's verifier sees what the agent left there, and no agent runs after it. (An overlay of
  the sandbox's ``/tmp`` would keep both, but the kernel refuses to clone a lower layer whose
  mount has locked submounts, as every mount inherited into a user namespace has.)

Docker's default seccomp profile refuses ``unshare`` and ``mount`` to a container without
``CAP_SYS_ADMIN``; the docker backend adds exactly these (`reroll.sandbox.docker.seccomp`).
Where the namespaces still cannot be made `available` says why, and the sidecar runs the script as
before, its fence and clean-up alone undoing what it can (the verify's note says so).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import signal
import socket
import struct
import subprocess
import sys

from reroll_contracts.namespaces import CLONE_NEWNET
from reroll_contracts.namespaces import VERIFY_NAMESPACES as FLAGS

from reroll_sidecar import loopback_relay

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 0x4000, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
KEYCTL_JOIN_SESSION_KEYRING = 1
KEY_SYSCALLS = {
    0xC000003E: (248, 249, 250),  # AUDIT_ARCH_X86_64 (x32's numbers too, their high bit masked)
    0x40000003: (286, 287, 288),  # AUDIT_ARCH_I386 (32-bit programs on x86_64)
    0xC00000B7: (217, 218, 219),  # AUDIT_ARCH_AARCH64
}
"""``add_key``, ``request_key`` and ``keyctl`` by the audit architecture a system call comes from."""
FAILED = 125
"""The launcher's exit status when it could not set the namespaces up."""
FRESH_TMP = ("/tmp", "/var/tmp")
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)
Relayed = tuple[list[int], socket.socket] | None
"""With its own network, the ports `run`'s child listens on and its end of the socket to the launcher."""


def under_fresh_tmp(paths: list[str]) -> bool:
    """Whether one of `paths` lies in a folder a soft verify would get empty (`FRESH_TMP`): then
    that verify keeps the sandbox's, or its script would not find its own files."""
    return any(
        os.path.commonpath([os.path.normpath(path), folder]) == folder
        for path in paths
        for folder in FRESH_TMP
        if os.path.isabs(path)
    )


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            kind.encode() if kind else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {kind or 'bind'} on {target}",
    )


def _die_with_parent() -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8)]
    _fields_ += [("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _no_keyrings() -> None:
    """Join a fresh session keyring, then refuse every keyring system call (``EPERM``) to this
    process and its children (module docstring). Needs ``CAP_SYS_ADMIN`` in its user namespace
    (it made that namespace) or no-new-privileges.

    Raises:
        OSError: the kernel refused the filter.
    """
    keyctl = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
    if keyctl is not None:  # refused under Docker's profile: no keys there anyway
        _libc.syscall(ctypes.c_long(keyctl), KEYCTL_JOIN_SESSION_KEYRING, None)
    load, mask, equal, ret = 0x20, 0x54, 0x15, 0x06  # BPF_LD|W|ABS, BPF_ALU|AND|K, BPF_JMP|JEQ|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    program = [(load, 0, 0, 4)]  # the architecture
    for arch, numbers in KEY_SYSCALLS.items():
        program.append((equal, 0, 7, arch))  # not this one: skip its 7 instructions
        program += [(load, 0, 0, 0), (mask, 0, 0, 0xBFFFFFFF)]  # the call's number, x32's bit off
        program += [(equal, 3 - index, 0, number) for index, number in enumerate(numbers)]
        program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    program.append((ret, 0, 0, allow))
    filters = (_SockFilter * len(program))(*(_SockFilter(*instruction) for instruction in program))
    fprog = _SockFprog(len(program), filters)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _identity_maps(pid: int) -> None:
    """Map every id the sidecar has to itself in `pid`'s new user namespace."""
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/self/{name}", encoding="ascii") as handle:
            ranges = [line.split() for line in handle if line.strip()]
        text = "".join(f"{inner} {inner} {count}\n" for inner, _outer, count in ranges)
        with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as handle:
            handle.write(text)


def _fresh_mounts(fresh_tmp: bool) -> None:
    """The namespace's own /dev/shm and /dev/mqueue, and with `fresh_tmp` its own empty /tmp and
    /var/tmp (module docstring)."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    folders = ["/dev/shm", *(FRESH_TMP if fresh_tmp else ())]
    for folder in (f for f in folders if os.path.isdir(f) and not os.path.islink(f)):
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    if os.path.isdir("/dev/mqueue"):
        _mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _loopback_up() -> None:
    """Bring ``lo`` up in this process's (new) network namespace: ``ip link set lo up``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _inside(argv: list[str], ready: int, go: int, fresh_tmp: bool, relayed: Relayed) -> int:
    """The launcher's child: unshare, wait for the id maps, mount, then run `argv` as PID 1; with
    `relayed` (its own network: the ports, the socket to the launcher), bring ``lo`` up and hand
    the launcher a listener on each port (`loopback_relay.listen_all`)."""
    _die_with_parent()
    _check(_libc.unshare(FLAGS | (CLONE_NEWNET if relayed else 0)), "unshare")
    os.write(ready, b"u")
    if os.read(go, 1) != b"g":
        return FAILED
    if relayed:
        ports, launcher = relayed
        _loopback_up()
        listeners = loopback_relay.listen_all(ports)
        if listeners:
            socket.send_fds(launcher, [b"l"], [sock.fileno() for sock in listeners])
        for sock in (*listeners, launcher):
            sock.close()
    _fresh_mounts(fresh_tmp)
    init = os.fork()
    if init == 0:
        try:
            _die_with_parent()
            with contextlib.suppress(OSError):  # refused under Docker's masked /proc: the old one stays
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _no_keyrings()
            os.execvp(argv[0], argv)
        finally:
            os._exit(FAILED)
    return os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])


def run(argv: list[str], fresh_tmp: bool = False, own_net: bool = False) -> int:
    """Run `argv` in fresh namespaces (module docstring; `fresh_tmp`: empty /tmp and /var/tmp of
    its own; `own_net`: a network namespace with only loopback); its exit status (a signal: 128 +
    its number), or `FAILED` when the namespaces could not be made (the reason on stderr)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    ends = socket.socketpair() if own_net else None
    ports = loopback_relay.loopback_ports() if own_net else []
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        os.close(go_w)
        try:
            status = _inside(argv, ready_w, go_r, fresh_tmp, (ports, ends[1]) if ends else None)
        except BaseException as exc:
            print(f"reroll-sidecar ns-exec: {exc}", file=sys.stderr, flush=True)
            status = FAILED
        os._exit(status if status >= 0 else 128 - status)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"u":
        try:
            _identity_maps(child)
            os.write(go_w, b"g")
        except OSError as exc:
            print(f"reroll-sidecar ns-exec: writing the id maps: {exc}", file=sys.stderr, flush=True)
    os.close(go_w)
    os.close(ready_r)
    if ends is not None:
        ends[1].close()
        with contextlib.suppress(OSError):  # nothing when the child failed before: it closed its end
            _, fds, _, _ = socket.recv_fds(ends[0], 1, max(len(ports), 1))
            loopback_relay.relay([socket.socket(fileno=fd) for fd in fds])
        ends[0].close()
    status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    return status if status >= 0 else 128 - status


@functools.cache
def available(own_net: bool = False) -> str:
    """Empty when `run` can make the namespaces here (`own_net`: the network namespace too), else
    why not (tried once per process and kind, in a child: the sidecar itself never forks)."""
    try:
        probe = command(["true"], own_net=own_net)
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the verify's own namespaces cannot be made: {exc}"
    if done.returncode == 0:
        return ""
    return f"the verify's own namespaces cannot be made: {done.stderr.strip()[-300:] or done.returncode}"


def refusal(own_net: bool = False) -> str:
    """Empty when a verify's script can run in namespaces of its own here (`own_net`: its own
    network namespace too), else why not: the sidecar is not root, or `available` says why."""
    return "the sidecar is not root" if os.geteuid() != 0 else available(own_net)


def command(argv: list[str], fresh_tmp: bool = False, own_net: bool = False) -> list[str]:
    """`argv` run through this module by the sidecar's own executable (``--fresh-tmp``,
    ``--own-net``: `run`'s)."""
    frozen = getattr(sys, "frozen", False)  # the sidecar bundle: its executable takes "ns-exec"
    prefix = [sys.executable] if frozen else [sys.executable, "-m", "reroll_sidecar"]
    options = [*(["--fresh-tmp"] if fresh_tmp else []), *(["--own-net"] if own_net else [])]
    return [*prefix, "ns-exec", *options, "--", *argv]


def main(argv: list[str]) -> int:
    """``ns-exec [--fresh-tmp] [--own-net] -- ARGV...``: `run`."""
    options = set()
    while argv[:1] and argv[0] in ("--fresh-tmp", "--own-net"):
        options.add(argv.pop(0))
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: reroll-sidecar ns-exec [--fresh-tmp] [--own-net] -- COMMAND...", file=sys.stderr)
        return 2
    return run(argv, "--fresh-tmp" in options, "--own-net" in options)
