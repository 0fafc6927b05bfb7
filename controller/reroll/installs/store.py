"""Shared installs (agents, the Python runtime): made in a step of their own, read-only to every
rollout, and checked against a manifest before each use.

A backend that implements `SharedInstalls` keeps its installs in one host folder (`InstallFolders`):
the ``local`` backends in ``<cache>/agents``, the docker backend in the volume ``reroll-agents``.
Every rollout's sandbox sees that folder read-only (its agents folder, ``layout.agents_dir``), so
nothing an agent or a verifier runs — root in a container included — can change what later
rollouts run. An install is one *unit*: a folder of the store named by its key (an agent's
``install_key``, a runtime's ``python3.12-<key>``). `ensure_installed` installs a unit in a
short-lived sandbox of its own (`SharedInstalls.installer`: the same image, the store writable,
network allowed; it runs the install script and nothing of the task's or the agent's), one
install of a unit at a time (a lock file beside its manifest), and records its manifest.

The manifest (`record_tree`) lists every entry of the unit's folder — byte code included, which
Python runs in place of a source whose hash or time it matches — with its kind, mode, owner, size,
sha256 (files) or target (symlinks), and the file's inode number, mtime and ctime. It lives
outside the store, where no sandbox can write: ``<cache>/install-manifests`` for ``local``, the
volume ``reroll-agents-manifests`` (mounted in no container) for docker; a container root that
could forge a manifest kept beside the install (an older reroll mounted the volume read-write)
cannot reach it. Before each use `check_tree` walks the unit again: an entry added, removed or
changed in kind, mode, owner, size or link target refuses it; a file whose inode, mtime and ctime
are all as recorded is taken as unchanged (the ctime is set by the kernel on every change of the
inode — a write, a chmod, a utimes — and no process can set it back without setting the
system's clock, which a container cannot); any other file is hashed again and refused when its
hash differs. A refused unit (changed after its install, or made by an older reroll: no
manifest) is moved aside, deleted and installed again, saying why. Cost: one ``lstat`` per
entry; ``scripts/bench/install_check`` measures it against hashing every file.

Older reroll versions sharing a store (the same cache or volume) installed in place in their
rollouts' sandboxes, under a lock file ``<unit>.lock`` in the store, skipping units marked by a
``.installed`` file: an install here holds that lock too and leaves that mark, so they wait for
it and then leave it alone (what they change anyway is refused here and installed again).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from reroll_contracts.errors import AgentInstallError

from reroll.cache import cache_dir
from reroll.host.pythons import PYENV_VERSIONS, host_python
from reroll.installs.python_runtime import provide_python, runtime_key
from reroll.sandbox.base import Sandbox
from reroll.sandbox.seam import InstallFolders, SharedInstalls

MANIFEST_FORMAT = 1
"""Version of the manifest files' shape; a manifest of another version refuses its unit."""
LOCK_POLL_SECONDS = 0.2
NOT_INSTALLED = "not installed"
"""`InstallStore.check`'s reason for a unit whose folder is missing (nothing to refuse)."""
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
OLD_MARK = ".installed"
"""The file that marked a finished install before manifests (still written: see `ensure_installed`)."""
REFUSED_PREFIX = ".refused-"
"""A refused unit is renamed ``.refused-<unit>-<random>`` in its store, then deleted."""

Log = Callable[[str], None]
logger = logging.getLogger(__name__)

Entry = list[int | str]
"""One entry of a manifest: ``[kind, mode, uid, gid, size, inode, mtime_ns, ctime_ns, value]``;
kind is ``d`` (folder), ``f`` (regular file: value = sha256 hex), ``l`` (symlink: value = its
target) or ``o`` (anything else: value empty)."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISREG(mode):
        return "f"
    return "l" if stat.S_ISLNK(mode) else "o"


def _sha256(path: str) -> str:
    """sha256 hex of the regular file `path`, opened without following a link or blocking.

    Raises:
        OSError: it cannot be opened, or is no longer a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} was replaced while hashed")
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _entry(path: str, info: os.stat_result, digest: bool) -> Entry:
    kind = _kind(info.st_mode)
    value = ""
    if kind == "f" and digest:
        value = _sha256(path)
    elif kind == "l":
        value = os.readlink(path)
    return [
        kind,
        stat.S_IMODE(info.st_mode),
        info.st_uid,
        info.st_gid,
        info.st_size if kind == "f" else 0,
        info.st_ino,
        info.st_mtime_ns,
        info.st_ctime_ns,
        value,
    ]


def _walk(folder: str) -> dict[str, tuple[str, os.stat_result]]:
    """``{relative path: (full path, lstat)}`` of `folder` (``"."``) and everything below it; no
    link is followed.

    Raises:
        OSError: `folder` or a folder below it cannot be listed.
    """
    found = {".": (folder, os.lstat(folder))}
    pending = [(folder, "")]
    while pending:
        full, relative = pending.pop()
        with os.scandir(full) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                name = f"{relative}{entry.name}"
                found[name] = (entry.path, info)
                if stat.S_ISDIR(info.st_mode):
                    pending.append((entry.path, f"{name}/"))
    return found


def record_tree(folder: Path) -> dict[str, Entry]:
    """The manifest entries of `folder` and everything below it (see the module docstring).

    Returns:
        ``{relative path ("." for `folder`): Entry}``, sorted by path.

    Raises:
        OSError: `folder` is missing, or something in it cannot be read.
    """
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"{folder} is not a folder")
    walked = _walk(str(folder))
    return {name: _entry(full, info, digest=True) for name, (full, info) in sorted(walked.items())}


def check_tree(folder: Path, recorded: dict[str, Entry], *, full: bool = False) -> str:
    """Compare `folder` with its manifest entries `recorded` (see the module docstring).

    Args:
        folder: the unit's host folder.
        recorded: what `record_tree` returned for it at install time.
        full: hash every file again, whatever its inode and times say.

    Returns:
        "" when it matches; else why not, naming the first path that differs.
    """
    try:
        walked = _walk(str(folder))
    except OSError as exc:
        return f"cannot be read: {exc}"
    if added := sorted(walked.keys() - recorded.keys()):
        return f"{added[0]} was added after the install"
    if removed := sorted(recorded.keys() - walked.keys()):
        return f"{removed[0]} was removed after the install"
    for name, (full_path, info) in sorted(walked.items()):
        want = recorded[name]
        have = _entry(full_path, info, digest=False)
        kind, mode, uid, gid, size, inode, mtime, ctime, value = want
        if have[:5] != [kind, mode, uid, gid, size]:
            return f"{name} changed (kind, mode, owner or size) after the install"
        if kind == "l" and have[8] != value:
            return f"{name} points elsewhere than at the install"
        if kind != "f" or (not full and have[5:8] == [inode, mtime, ctime]):
            continue
        try:
            digest = _sha256(full_path)
        except OSError as exc:
            return f"{name} cannot be read: {exc}"
        if digest != value:
            return f"{name} changed after the install (sha256 differs)"
    return ""


def _host_interpreter(entries: dict[str, Entry]) -> str:
    """Why an install whose venv runs the host's own pyenv interpreter may not be used (an older
    reroll made it so in ``local-plain``; the isolated ``local`` sandbox, which shares the store,
    does not see the host's pyenv): it is installed again on the relocatable runtime. "" if none."""
    for name, (kind, *_, target) in entries.items():
        if kind == "l" and str(target).startswith(f"{PYENV_VERSIONS}/"):
            return f"{name} runs the host's own {target}, which the isolated sandboxes do not see"
    return ""


@dataclass(frozen=True)
class InstallStore(InstallFolders):
    """A backend's shared installs on the host (`InstallFolders`: one folder per unit, and their
    manifests), checked, recorded and discarded unit by unit."""

    @classmethod
    def of(cls, folders: InstallFolders) -> InstallStore:
        """The store at `folders` (what `SharedInstalls.install_store` answers)."""
        return cls(folder=folders.folder, manifests=folders.manifests)

    def manifest_file(self, unit: str) -> Path:
        """The manifest of `unit` (JSON)."""
        return self.manifests / f"{_unit_name(unit)}.json"

    def locked(self, unit: str, *, shared: bool = False) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the lock of `unit` (``<manifests>/<unit>.lock``): exclusive to install it, `shared`
        to check it (checks run together, never during an install)."""
        return _flock(self.manifests / f"{_unit_name(unit)}.lock", shared=shared)

    def check(self, unit: str, *, full: bool = False) -> str:
        """Whether `unit` may be used: "" when its folder matches its manifest, and so do the units
        it requires; else why not (`NOT_INSTALLED` when its folder is missing)."""
        if not (self.folder / _unit_name(unit)).exists():
            return NOT_INSTALLED
        try:
            manifest = json.loads(self.manifest_file(unit).read_text())
        except FileNotFoundError:
            return f"it has no manifest in {self.manifests} (made by an older reroll, or interrupted)"
        except (OSError, ValueError) as exc:
            return f"its manifest {self.manifest_file(unit)} cannot be read: {exc}"
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            return f"its manifest {self.manifest_file(unit)} is not of format {MANIFEST_FORMAT}"
        if reason := check_tree(self.folder / unit, manifest["entries"], full=full):
            return reason
        if reason := _host_interpreter(manifest["entries"]):
            return reason
        for required in manifest.get("requires", []):
            if reason := self.check(required, full=full):
                return f"the install it requires, {required}: {reason}"
        return ""

    def record(self, unit: str, requires: list[str]) -> dict[str, int]:
        """Write the manifest of `unit` as its folder is now (just installed), naming the units it
        `requires` (checked with it).

        Returns:
            ``{"entries": number of entries, "bytes": total size of its files}``.

        Raises:
            OSError: the folder cannot be read or the manifest written.
        """
        entries = record_tree(self.folder / _unit_name(unit))
        manifest = {"format": MANIFEST_FORMAT, "unit": unit, "requires": requires, "entries": entries}
        self.manifests.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = self.manifests / f".{unit}.json.{secrets.token_hex(4)}"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(manifest, out, separators=(",", ":"))
        os.replace(partial, self.manifest_file(unit))
        return {"entries": len(entries), "bytes": sum(int(e[4]) for e in entries.values())}

    def discard(self, unit: str) -> None:
        """Delete `unit`'s folder (moved aside first, so no half-deleted install is ever found under
        its name) and its manifest; either may be missing.

        Raises:
            OSError: the folder cannot be moved aside.
        """
        self.manifest_file(unit).unlink(missing_ok=True)
        folder = self.folder / _unit_name(unit)
        if not folder.exists() and not folder.is_symlink():
            return
        aside = self.folder / f"{REFUSED_PREFIX}{unit}-{secrets.token_hex(4)}"
        os.rename(folder, aside)
        if aside.is_symlink() or not aside.is_dir():
            aside.unlink()
        else:
            shutil.rmtree(aside, ignore_errors=True)


@contextlib.asynccontextmanager
async def _flock(path: Path, *, shared: bool = False) -> AsyncIterator[None]:
    """Hold a flock on `path` (created, with its folder, mode 0700), exclusive unless `shared`,
    polled every `LOCK_POLL_SECONDS` so the event loop is not blocked and a cancelled wait leaves
    nothing held."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(LOCK_POLL_SECONDS)
        yield


def _unit_name(unit: str) -> str:
    """`unit`, checked to be one plain file name.

    Raises:
        AgentInstallError: it is not (a path, a dot file, characters beyond ``[A-Za-z0-9._+-]``).
    """
    if not UNIT_NAME.fullmatch(unit):
        raise AgentInstallError(
            f"{unit!r} cannot name an install folder: use letters, digits, '.', '_', '+', '-'"
        )
    return unit


Install = Callable[[Sandbox, str], Awaitable[list[str]]]
"""Installs a unit into the sandbox given (an installer) at the folder given (inside it, empty);
returns the units it made the unit depend on (their manifests are checked with its own)."""


async def ensure_installed(sandbox: Sandbox, unit: str, install: Install, log: Log = logger.info) -> None:
    """Make sure `unit` is installed and intact in `sandbox`'s agents folder before it is used.

    With a `SharedInstalls` backend: `InstallStore.check` it (under its lock, shared); when missing
    or refused (the reason is logged), under its lock held alone: discard it, run `install` in
    the backend's installer, and record its manifest. With another backend (one outside
    reroll): install in the rollout's own sandbox, once per agents folder (a ``.installed`` file
    marks it), unchecked.

    Args:
        sandbox: the rollout's (started) sandbox.
        unit: the install's folder name under ``layout.agents_dir``.
        install: does the install (see `Install`).
        log: where what is done is said.

    Raises:
        AgentInstallError: `install` failed, or `unit` is not a plain folder name.
        SandboxError: the installer or the store failed.
    """
    home = f"{sandbox.layout.agents_dir}/{_unit_name(unit)}"
    if not isinstance(sandbox, SharedInstalls):
        await _install_in_place(sandbox, unit, install, log)
        return
    store = InstallStore.of(await sandbox.install_store())
    async with store.locked(unit, shared=True):
        started = time.monotonic()
        reason = await asyncio.to_thread(store.check, unit)
        logger.debug("install %s checked in %.3f s: %s", unit, time.monotonic() - started, reason or "ok")
    if not reason:
        return
    # Also the lock older reroll versions take in the store (``<unit>.lock`` beside the unit), so
    # that one sharing the store waits, then finds the `OLD_MARK` and leaves the install alone.
    async with store.locked(unit), _flock(store.folder / f"{unit}.lock"):
        reason = await asyncio.to_thread(store.check, unit)  # another process may have installed it
        if not reason:
            return
        if reason != NOT_INSTALLED:
            log(f"refusing the install {store.folder / unit}: {reason}; installing it again")
        await asyncio.to_thread(store.discard, unit)
        log(f"installing {unit}")
        async with sandbox.installer() as installer:
            made = await installer.exec(["mkdir", "-p", home], inherit_env=False)
            if made.exit_code != 0:
                raise AgentInstallError(f"cannot make the install folder {home}: {made.output_text()}")
            try:
                requires = await install(installer, home)
                # The mark of a finished install of older reroll versions, which would otherwise
                # install again over this one where they share the store (the same volume).
                await installer.exec(["touch", f"{home}/{OLD_MARK}"], inherit_env=False)
            except BaseException:
                with contextlib.suppress(Exception):
                    await installer.exec(["rm", "-rf", home], inherit_env=False)
                raise
        recorded = await asyncio.to_thread(store.record, unit, requires)
        size = f"{recorded['entries']} entries, {recorded['bytes'] / 1e6:.0f} MB"
        log(f"installed {unit} ({size}); its manifest is recorded")


async def _install_in_place(sandbox: Sandbox, unit: str, install: Install, log: Log) -> None:
    """`ensure_installed` for a backend without `SharedInstalls`: in the rollout's sandbox, as reroll
    did before, marked done by ``<home>/.installed``, one install at a time on this host."""
    home = f"{sandbox.layout.agents_dir}/{unit}"
    async with _flock(cache_dir() / "install-locks" / f"{unit}.lock"):
        if (await sandbox.exec(["test", "-f", f"{home}/{OLD_MARK}"], inherit_env=False)).exit_code == 0:
            return
        log(f"installing {unit} into {home} (first time only)")
        await sandbox.exec(["sh", "-c", f'rm -rf "{home}" && mkdir -p "{home}"'], inherit_env=False)
        await install(sandbox, home)
        await sandbox.exec(["touch", f"{home}/{OLD_MARK}"], inherit_env=False)


async def provide_runtime(
    installer: Sandbox, version: str, env: dict[str, str], log: Log = logger.info
) -> tuple[str, list[str]]:
    """`reroll.installs.python_runtime.provide_python` in an installer, with the runtime uploaded
    into the store as a unit of its own: checked (and discarded when refused) before it is used,
    its manifest recorded after an upload.

    Returns:
        The interpreter's path in the sandbox, and ``[the runtime's unit]`` when it is one of the
        store's (else ``[]``: the sandbox's own, or the host's).

    Raises:
        AgentInstallError, ImageBuildError: as `provide_python`.
        SandboxError: the store failed.
    """
    if not isinstance(installer, SharedInstalls):
        return await provide_python(installer, version, env, log), []
    store = InstallStore.of(await installer.install_store())
    agents_dir = installer.layout.agents_dir
    host = await asyncio.to_thread(host_python, version)
    planned = f"python{version}-{await asyncio.to_thread(runtime_key, host, agents_dir)}" if host else None
    async with store.locked(planned) if planned else contextlib.nullcontext():
        if planned is not None and (reason := await asyncio.to_thread(store.check, planned)):
            if reason != NOT_INSTALLED:
                log(f"refusing the Python runtime {store.folder / planned}: {reason}; uploading it again")
            await asyncio.to_thread(store.discard, planned)
        python = await provide_python(installer, version, env, log)
        if not python.startswith(f"{agents_dir}/"):
            return python, []
        unit = python.removeprefix(f"{agents_dir}/").split("/")[0]
        if await asyncio.to_thread(store.check, unit):
            await asyncio.to_thread(store.record, unit, [])
        return python, [unit]
