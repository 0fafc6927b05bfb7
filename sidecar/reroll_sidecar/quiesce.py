"""Quiesce: stop, then kill, every process of the agent, whatever it does to escape.

A single pass of SIGKILL over /proc misses a process that forks and lets its parent exit every few
milliseconds (its pid keeps changing: a full scan of /proc is slower than the hops), and killing
process groups misses whatever left them with ``setsid``. `quiesce` therefore freezes first, then
kills, then checks that none is left (walking the sidecar's descendants; for the agent's user,
with a full scan of /proc). The whole takes at most a time
limit, after which `QuiesceError` is raised.

Which processes are the agent's (`Selection`), and how each kind is frozen:

- by user: every process one of whose user ids (real, effective, saved, file system) is the
  agent's — in a container, where the sidecar is root and the agent runs as its own user. A
  helper thread of the sidecar takes that user's ids (Linux credentials are per thread; the raw
  ``setresuid`` system call, not libc's, which would change every thread's) and sends
  ``kill(-1, SIGSTOP)``, then ``kill(-1, SIGKILL)``: the kernel signals every process of the user
  in one walk of its task list, which a fork cannot race (a fork that overlaps a group signal is
  restarted), so no pid hopping escapes. No tool of the image is needed;
- by descent: every descendant of the sidecar outside the sidecar's own session — what Exec
  started (each Exec child leads a new session) and everything those started, even after
  ``setsid`` or a double fork, because the sidecar makes itself a *child subreaper*
  (``prctl(PR_SET_CHILD_SUBREAPER)``, `become_subreaper`), so orphans are re-parented to it
  rather than to init. The sidecar's own helpers (find, tar, python3) stay in its session. They
  are frozen by walking the kernel's children lists (``/proc/PID/task/TID/children``) from the
  sidecar down, sending SIGSTOP to each process as it is found, until two walks in a row find
  only stopped processes (a stopped process cannot fork; adopted zombies are reaped on the way
  so the lists stay short); then each gets SIGKILL.

The task's services (`Selection.spare`) are spared by descent: a walk that meets one of them —
a child of the sidecar whose pid *and* start time (``/proc/PID/stat`` field 22) are those it had
when Exec spawned it as a service — neither stops it nor goes below it. What they fork stays
theirs; nothing else can join that subtree (a process's place in the tree is set by the kernel
at fork, an orphan is re-parented to the sidecar, never into a service; a process group or a
session cannot be joined across sessions), so no name, pid file or variable the agent writes
makes its process a service. The agent's user is still killed everywhere by user, inside a
service's subtree too: a service runs as root.

cgroups (``cgroup.freeze`` / ``cgroup.kill``) would do the same in one write, but an unprivileged
Docker container sees its cgroup file system read-only, and the local sandbox has no cgroup of
its own; the signal loop works in both.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import pwd
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from reroll_contracts.errors import QuiesceError

from reroll_sidecar import nofollow

QUIESCE_TIMEOUT_SECONDS = 20.0
"""The longest a quiesce may take before `QuiesceError` (less than the controller's Kill deadline)."""
SCAN_PAUSE_SECONDS = 0.002
"""The pause between scans while signalled processes have not stopped or died yet."""
CALM_WALKS = 2
"""Walks in a row that must find every descendant stopped before the kill."""
SETRESUID = {"x86_64": 117, "aarch64": 147}
"""The ``setresuid`` system call's number per machine (asm/unistd.h)."""
PR_SET_CHILD_SUBREAPER = 36
"""prctl option (linux/prctl.h): orphaned descendants are re-parented to the caller."""
STOPPED_STATES = frozenset("tTD")
"""States in which a signalled process cannot fork: stopped, traced, or in an uninterruptible wait
(it handles the pending SIGSTOP before it returns to user space; a vfork parent waits in D until
its stopped child dies)."""
DEAD_STATES = frozenset("ZXx")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    pid: int
    state: str
    """One letter of ``/proc/PID/stat`` (R, S, D, T, t, Z, …)."""
    ppid: int
    session: int
    uids: tuple[int, ...]
    """Real, effective, saved and file-system user ids."""


@dataclass(frozen=True)
class Identity:
    """One process as spawned: its pid and its start time (``/proc/PID/stat`` field 22, clock
    ticks since boot), which a later process reusing the pid does not share."""

    pid: int
    start_ticks: int


@dataclass(frozen=True)
class Selection:
    """Which processes are the agent's (see the module docstring).

    Attributes:
        uid: every process with this user id among its ids; None: none by user.
        descendants: every descendant of the sidecar outside its session.
        spare: the task's services: with `descendants`, they and their own descendants are not
            selected (unless of user `uid`).
    """

    uid: int | None
    descendants: bool = True
    spare: frozenset[Identity] = frozenset()


def identity(pid: int) -> Identity | None:
    """`pid` as it is now (its start time from ``/proc/PID/stat``); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # fields[0] is field 3 (state)
    try:
        return Identity(pid=pid, start_ticks=int(fields[19]))
    except (IndexError, ValueError):
        return None


def _spared(pid: int, spare: frozenset[Identity]) -> bool:
    """Whether `pid` is one of the services in `spare` (same pid and start time)."""
    return any(item.pid == pid for item in spare) and identity(pid) in spare


def _stat(pid: int) -> tuple[str, int, int] | None:
    """`pid`'s state letter, parent pid and session from ``/proc/PID/stat`` (proc(5): fields 3, 4
    and 6); None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold any byte: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode(), int(fields[1]), int(fields[3])
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _read_proc(pid: int) -> Proc | None:
    """`pid`'s state, parent, session and user ids; None when it is gone or unreadable."""
    stat = _stat(pid)
    if stat is None:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            uid_line = next(line for line in handle if line.startswith("Uid:"))
        uids = tuple(int(value) for value in uid_line.split()[1:])
    except (OSError, StopIteration, ValueError):
        return None
    state, ppid, session = stat
    return Proc(pid=pid, state=state, ppid=ppid, session=session, uids=uids)


def scan() -> dict[int, Proc]:
    """Every process in /proc, by pid (empty without /proc)."""
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return {}
    procs = (_read_proc(int(entry)) for entry in entries if entry.isdigit())
    return {proc.pid: proc for proc in procs if proc is not None}


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _children(pid: int) -> list[int]:
    """The children of `pid` (all its threads'), from the kernel's lists; empty when it is gone."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def _freeze_descendants(
    deadline: float, keep: set[int], spare: frozenset[Identity] = frozenset()
) -> set[int]:
    """SIGSTOP every descendant of the sidecar outside its session but the services in `spare`
    and their descendants, walking down from it, until two walks in a row find only stopped
    ones; returns their pids.

    Raises:
        QuiesceError: they were still not all stopped at `deadline` (`time.monotonic`).
    """
    own_pid, own_session = os.getpid(), os.getsid(0)
    signalled: set[int] = set()
    calm = 0
    while calm < CALM_WALKS:
        _reap_adopted(keep)
        found: set[int] = set()
        running: set[int] = set()
        queue = _children(own_pid)
        while queue:
            pid = queue.pop()
            info = _stat(pid)
            if info is None or info[0] in DEAD_STATES or pid in found:
                continue
            state, _, session = info
            if session == own_session and pid not in signalled:
                continue  # the sidecar's own helper
            if pid not in signalled and _spared(pid, spare):
                continue  # a task's service, and what it forked
            if pid not in signalled:
                _signal([pid], signal.SIGSTOP)
                signalled.add(pid)
                running.add(pid)
            elif state not in STOPPED_STATES:
                running.add(pid)
            found.add(pid)
            queue.extend(_children(pid))
        calm = 0 if running else calm + 1
        if running and time.monotonic() > deadline:
            raise QuiesceError(
                f"quiesce: {len(running)} of the agent's processes still running (such as pid {min(running)})"
            )
    return found


def _signal_all_as(uid: int, signal_name: str) -> None:
    """Send `signal_name` to every process of user `uid`: ``kill(-1)`` from a helper thread that
    holds `uid` as its real and effective user id (one walk of the kernel's task list; the
    sidecar itself is spared, as the caller of ``kill(-1)``).

    Raises:
        QuiesceError: the thread could not take the user's ids (an unknown machine, say).
    """
    number = signal.Signals[f"SIG{signal_name}"]
    failure: list[str] = []

    def as_user() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        call = SETRESUID.get(platform.machine())
        # Saved uid 0 is kept so the thread can become root again (or simply ends).
        if call is None or libc.syscall(call, uid, uid, 0) != 0:
            failure.append(f"cannot act as uid {uid}: errno {ctypes.get_errno()}")
            return
        try:
            with contextlib.suppress(ProcessLookupError):  # no process of that user
                os.kill(-1, number)
        finally:
            libc.syscall(call, 0, 0, 0)

    helper = threading.Thread(target=as_user, name=f"quiesce-as-{uid}")
    try:
        helper.start()
    except RuntimeError:  # "can't start new thread": the agent used up the sandbox's pids
        _signal_user_by_pid(uid, number)
        return
    helper.join()
    if failure:
        raise QuiesceError(f"quiesce: {failure[0]}")


def _signal_user_by_pid(uid: int, number: signal.Signals) -> None:
    """`_signal_all_as` without a helper thread: signal each process of user `uid` that a scan of
    /proc finds, from the sidecar's own ids, until a scan finds no new one (racy against a fork
    between scans, which the caller's scan loop catches; used when the agent's processes have
    taken every pid the sandbox allows, so that no thread can start)."""
    signalled: set[int] = set()
    while found := {p.pid for p in scan().values() if uid in p.uids and p.pid not in signalled}:
        _signal(found, number)
        signalled |= found


def uid_gid(uid: int) -> int:
    """The primary group of user `uid` (its uid when it has no passwd entry)."""
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def quiesce(
    selection: Selection, *, keep_reaped: Iterable[int] = (), timeout_seconds: float = QUIESCE_TIMEOUT_SECONDS
) -> int:
    """Freeze, then kill, every process `selection` picks, until a scan of /proc finds none.

    Args:
        selection: which processes are the agent's.
        keep_reaped: pids another thread waits for (Exec's children): never reaped here. Other
            zombie children of the sidecar (adopted orphans) are reaped.
        timeout_seconds: the time limit of the whole.

    Returns:
        How many processes were frozen by descent and killed (those killed by user through
        ``kill -1`` are not counted).

    Raises:
        QuiesceError: processes were still running, or not yet gone, after `timeout_seconds`.
    """
    deadline = time.monotonic() + timeout_seconds
    keep = set(keep_reaped)
    frozen = _stop(selection, deadline, keep)
    if selection.uid is not None:
        _signal_all_as(selection.uid, "KILL")
    _signal(frozen, signal.SIGKILL)
    while True:
        _reap_adopted(keep)
        left = _live_descendants(selection.spare) if selection.descendants else set()
        if selection.uid is not None:  # a full scan: the user's processes need not descend from us
            left |= {p.pid for p in scan().values() if selection.uid in p.uids and p.state not in DEAD_STATES}
        if not left:
            break
        if time.monotonic() > deadline:
            raise QuiesceError(f"quiesce: pid {min(left)} (and {len(left) - 1} more) survived SIGKILL")
        _signal(left, signal.SIGKILL)
        if selection.uid is not None:
            _signal_all_as(selection.uid, "KILL")
        time.sleep(SCAN_PAUSE_SECONDS)
    if frozen:
        log.info("quiesce: %d processes frozen and killed", len(frozen))
    return len(frozen)


def _stop(selection: Selection, deadline: float, keep: set[int]) -> set[int]:
    """SIGSTOP every process `selection` picks (by user in one ``kill -1``, by descent in walks);
    returns the pids stopped by descent.

    Raises:
        QuiesceError: as `_freeze_descendants`, or the user's ids could not be taken.
    """
    if selection.uid is not None:
        _signal_all_as(selection.uid, "STOP")
    return _freeze_descendants(deadline, keep, selection.spare) if selection.descendants else set()


@dataclass(frozen=True)
class Frozen:
    """The processes `freeze` stopped, for `thaw`: a user's (all of them) and those found by
    descent, each as it was (a pid reused meanwhile is not continued)."""

    uid: int | None
    descendants: frozenset[Identity]


def freeze(
    selection: Selection, *, keep_reaped: Iterable[int] = (), timeout_seconds: float = QUIESCE_TIMEOUT_SECONDS
) -> Frozen:
    """Stop every process `selection` picks and leave them stopped (the first half of `quiesce`):
    none can run, fork or write until `thaw` or a `quiesce` (which kills stopped processes too).

    Raises:
        QuiesceError: some were still running after `timeout_seconds`.
    """
    stopped = _stop(selection, time.monotonic() + timeout_seconds, set(keep_reaped))
    found = (identity(pid) for pid in stopped)
    return Frozen(uid=selection.uid, descendants=frozenset(item for item in found if item is not None))


def thaw(frozen: Frozen) -> None:
    """SIGCONT what `freeze` stopped: every process of its user, and each process it stopped by
    descent that is still the same process.

    Raises:
        QuiesceError: the user's ids could not be taken.
    """
    if frozen.uid is not None:
        _signal_all_as(frozen.uid, "CONT")
    _signal((item.pid for item in frozen.descendants if identity(item.pid) == item), signal.SIGCONT)


def _reap_adopted(keep: set[int]) -> None:
    """Reap the sidecar's zombie children but `keep` (adopted orphans die as its children)."""
    own_session = os.getsid(0)
    for pid in _children(os.getpid()):
        info = _stat(pid)
        if info is not None and info[0] == "Z" and info[2] != own_session and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _live_descendants(spare: frozenset[Identity] = frozenset()) -> set[int]:
    """The sidecar's live descendants outside its session but the services in `spare` and their
    descendants, from the kernel's children lists."""
    own_session = os.getsid(0)
    found: set[int] = set()
    queue = _children(os.getpid())
    while queue:
        pid = queue.pop()
        info = _stat(pid)
        if pid in found or info is None or info[0] in DEAD_STATES or info[2] == own_session:
            continue
        if _spared(pid, spare):
            continue
        found.add(pid)
        queue.extend(_children(pid))
    return found


def become_subreaper() -> bool:
    """Make the calling process a child subreaper (Linux ``prctl``); False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def let_go(frozen: Frozen, workspace: list[str]) -> str:
    """Let the agent's frozen processes go on for the test script (Harbor keeps a server the
    tests talk to), once they cannot touch what decides the reward: with an agent user the
    `workspace` (a list of at most one folder) is handed to root first
    (`reroll_sidecar.nofollow.hand_tree_to_root`: no hook planted, no copied test swapped); the
    verifier's and the reward folders are root's already. Without one, the caller keeps them only
    for the task's own solution. Returns the hardening report's note.

    Raises:
        QuiesceError: the agent user's ids could not be taken.
    """
    handed = ""
    if frozen.uid is not None and workspace:
        count = nofollow.hand_tree_to_root(workspace[0])
        handed = f"; the workspace ({count} entries) is root's now"
    thaw(frozen)
    return f"the agent's processes were kept for the test script{handed}"
