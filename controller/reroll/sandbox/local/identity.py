"""One host identity per isolated local sandbox: its own range of host ids, and the shared files
shown to it as its own through idmapped mounts.

Slots: a rollout sandbox takes a free slot ``n`` (`IdSlot.acquire`) and its ids ``0..ID_COUNT-1``
map to the host's ``SLOT_ID_START + n * ID_COUNT ..`` (`IdSlot.base`), so no two running sandboxes
share a host uid: neither can signal, ptrace or write the other's processes and files, and the
kernel's per-user limits (inotify instances, processes, the user keyring) are each sandbox's own. A
slot is held by an exclusive ``flock`` on ``<SLOTS_DIR>/<n>`` (a root-only folder) for the
sandbox's lifetime: the kernel drops the lock when its holder dies, so a crashed controller's
slots are free again. The file holds the holder's pid while held and is emptied on release; a slot
found locked by nobody yet not emptied (its holder crashed) is reused only when no process runs
under its range (`_range_busy`); ``reroll sandbox prune --sandbox local`` (`reclaim_slots`) kills
what still runs under such a range and empties its file. The ranges start above the installer's
(`INSTALLER_ID_BASE`) and the shared images' (`IMAGE_ID_BASE`): neither is ever a sandbox's.

Shared files: a task image's unpacked file system (`reroll.sandbox.local.imagefs`) is owned by
`IMAGE_ID_BASE..` on the host, once for all rollouts. Each sandbox mounts it through an idmapped
mount (`idmapped_tree`: ``open_tree`` + ``mount_setattr(MOUNT_ATTR_IDMAP)``, Linux 5.12+; as an
overlay's lower layer from Linux 6.15, where a detached mount may be one) that shows
``IMAGE_ID_BASE + k`` as ``base + k``: the sandbox's root owns what root owned in the image, no
copy and no chown per rollout, and a copy-up into its own upper layer keeps its own ids.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from reroll_contracts.errors import SandboxError

from reroll.sandbox.local.rootview import ID_COUNT, IMAGE_ID_BASE, INSTALLER_ID_BASE

SLOT_ID_START = 1 << 20
"""The host id of slot 0's root; above `IMAGE_ID_BASE` and `INSTALLER_ID_BASE`'s ranges."""
SLOT_COUNT = 4096
"""How many sandboxes may run at once on a host (the last range ends below 2**29)."""
SLOTS_DIR = Path("/run/reroll/id-slots")
"""The root-only folder of the slots' lock files."""
assert max(IMAGE_ID_BASE, INSTALLER_ID_BASE) + ID_COUNT <= SLOT_ID_START

_SYS_OPEN_TREE, _SYS_MOUNT_SETATTR = 428, 442  # x86_64 and aarch64 (the unified syscall table)
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _AT_RECURSIVE, _AT_EMPTY_PATH = 1, os.O_CLOEXEC, 0x8000, 0x1000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 0x1, 0x100000


class _MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


@dataclass
class IdSlot:
    """A sandbox's range of host ids, held until `release` (or its holder's death)."""

    index: int
    handle: IO[str]
    """The slot's lock file, locked exclusively while held."""

    @property
    def base(self) -> int:
        """The host uid and gid of the sandbox's root; its ids are ``base..base+ID_COUNT-1``."""
        return SLOT_ID_START + self.index * ID_COUNT

    @classmethod
    def acquire(cls, folder: Path | None = None) -> IdSlot:
        """Take the first free slot (see the module docstring).

        Args:
            folder: where the lock files are (made root-only when missing); `SLOTS_DIR` by default.

        Raises:
            SandboxError: every slot is taken, or the folder cannot be used.
        """
        folder = SLOTS_DIR if folder is None else folder
        try:
            folder.mkdir(parents=True, mode=0o700, exist_ok=True)
            for index in range(SLOT_COUNT):
                handle = open(folder / str(index), "a+")  # noqa: SIM115 - held until release
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                slot = cls(index, handle)
                handle.seek(0)
                if handle.read().strip() and _range_busy(slot.base):
                    handle.close()  # a crashed holder's processes still run: leave it
                    continue
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                return slot
        except OSError as exc:
            raise SandboxError(f"cannot take a sandbox id range in {folder}: {exc}") from exc
        raise SandboxError(f"all {SLOT_COUNT} sandbox id ranges in {folder} are in use")

    def release(self) -> None:
        """Give the slot back (its file emptied: released cleanly). Safe to call twice."""
        if self.handle.closed:
            return
        with contextlib.suppress(OSError):
            self.handle.truncate(0)
        self.handle.close()


RECLAIM_SECONDS = 5.0
"""How long `reclaim_slots` waits for a crashed slot's processes to end after SIGKILL."""


def reclaim_slots(folder: Path | None = None) -> list[str]:
    """Free the slots of killed controllers: each slot whose file still names a holder but is
    locked by nobody (its holder died without `IdSlot.release`) is locked, every process left
    under its range is killed (SIGKILL; a sandbox's PID namespace goes with its init), and, once
    none is left, its file is emptied and the lock let go. A slot held by a live holder is never
    touched: the lock is the proof of ownership, not the pid in the file. Needs root.

    Args:
        folder: where the lock files are (`SLOTS_DIR` by default); a missing folder has nothing
            to reclaim.

    Returns:
        The host id ranges freed, as ``"<first>-<last>"``.
    """
    freed = []
    folder = SLOTS_DIR if folder is None else folder
    slots = [entry for entry in folder.glob("*") if entry.name.isdigit()]
    for path in sorted(slots, key=lambda entry: int(entry.name)):
        try:
            handle = open(path, "r+")  # noqa: SIM115 - closed by the with below
        except OSError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live holder's
            if not handle.read().strip():
                continue  # released cleanly
            base = SLOT_ID_START + int(path.name) * ID_COUNT
            deadline = time.monotonic() + RECLAIM_SECONDS
            while (pids := _range_pids(base)) and time.monotonic() < deadline:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)
            if not pids:
                handle.truncate(0)
                freed.append(f"{base}-{base + ID_COUNT - 1}")
    return freed


def _range_pids(base: int) -> list[int]:
    """The host processes with a uid (real, effective, saved or file system) in
    ``base..base+ID_COUNT-1``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as status:
                uids = next(line for line in status if line.startswith("Uid:")).split()[1:]
        except (OSError, StopIteration):
            continue  # gone meanwhile
        if any(base <= int(uid) < base + ID_COUNT for uid in uids):
            found.append(int(name))
    return found


def _range_busy(base: int) -> bool:
    """Whether a host process runs under ``base..base+ID_COUNT-1`` (`_range_pids`)."""
    return bool(_range_pids(base))


def userns_fd(inside: int, outside: int, count: int) -> int:
    """A user namespace whose ids ``inside..inside+count-1`` are the host's ``outside..`` (uids
    and gids), as an open descriptor (close-on-exec; the caller closes it). Needs root.

    Raises:
        OSError: ``unshare`` is missing or failed, or the maps could not be written.
    """
    holder = subprocess.Popen(
        ["unshare", "--user", "sh", "-c", "echo; read line"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if not holder.stdout.readline():
            raise OSError(errno.ESRCH, "unshare --user exited before making its namespace")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as out:
                out.write(f"{inside} {outside} {count}\n")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.stdin.close()
        holder.stdout.close()
        holder.wait()


def idmapped_tree(path: Path, from_base: int, to_base: int) -> int:
    """A detached, read-only, idmapped copy of the mount tree at `path`, showing the owners
    ``from_base + k`` (``k < ID_COUNT``) as ``to_base + k`` (others as ``nobody``); an open
    descriptor (close-on-exec) that ``/proc/<pid>/fd/<fd>`` names, for instance as an overlay's
    lower layer. The mount goes when the descriptor and its users are closed. Needs root.

    Raises:
        OSError: the kernel refused (older than 5.12, or the file system cannot be idmapped).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    namespace = userns_fd(from_base, to_base, ID_COUNT)
    try:
        flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
        tree = int(libc.syscall(_SYS_OPEN_TREE, -100, os.fsencode(path), flags))  # -100: AT_FDCWD
        if tree < 0:
            raise OSError(ctypes.get_errno(), f"open_tree {path}")
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, namespace)
        done = libc.syscall(
            _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)
        )
        if done < 0:
            code = ctypes.get_errno()
            os.close(tree)
            raise OSError(code, f"mount_setattr(MOUNT_ATTR_IDMAP) {path}")
        return tree
    finally:
        os.close(namespace)


def shift_tree(path: Path, from_base: int, to_base: int) -> None:
    """Give each entry of `path` (itself included; links not followed) owned by ``from_base + k``
    (``k < ID_COUNT``) to ``to_base + k``, uid and gid alike; other owners are left as they are."""
    if from_base == to_base:
        return

    def shift(entry: str) -> None:
        info = os.lstat(entry)
        uid, gid = (
            to_base + value - from_base if from_base <= value < from_base + ID_COUNT else value
            for value in (info.st_uid, info.st_gid)
        )
        if (uid, gid) != (info.st_uid, info.st_gid):
            os.lchown(entry, uid, gid)
            if not os.path.islink(entry) and info.st_mode & 0o6000:
                os.chmod(entry, info.st_mode & 0o7777)  # chown clears setuid and setgid

    shift(str(path))
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            shift(os.path.join(folder, name))
