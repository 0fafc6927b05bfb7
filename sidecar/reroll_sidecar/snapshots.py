"""Named snapshots of paths in the sandbox, restored exactly (contents, modes, owners, symlinks, deletions).

A snapshot is a folder ``<state dir>/snapshots/<name>/`` holding ``paths.json`` (the paths asked
for, and which of them existed) and ``content.tar``, made by GNU tar with numeric owners. Restore
deletes every saved path first, so whatever was created under it since disappears, then
extracts the archive as it was. tar is the one method: it works on every file system, including
fuse-overlayfs, where reflinks are not available.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from dataclasses import dataclass

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
TAR_TIMEOUT_SECONDS = 600.0


class SnapshotError(Exception):
    """A snapshot request is invalid, or tar failed; `kind` says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        """``invalid`` (bad request), ``not_found`` (no such snapshot) or ``failed`` (tar failed)."""


@dataclass(frozen=True)
class Saved:
    """What `SnapshotStore.save` stored."""

    size_bytes: int
    method: str


def _remove(path: str) -> None:
    """Delete `path` whatever it is (file, symlink, folder); nothing when it does not exist."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


async def _tar(*args: str) -> None:
    """Run GNU tar with `args`; raise SnapshotError("failed") with its stderr on failure."""
    process = await asyncio.create_subprocess_exec(
        "tar", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), TAR_TIMEOUT_SECONDS)
    except TimeoutError:
        process.kill()
        raise SnapshotError("failed", f"tar {args[0]} took longer than {TAR_TIMEOUT_SECONDS:.0f} s") from None
    if process.returncode != 0:
        raise SnapshotError("failed", f"tar {args[0]} failed: {stderr.decode(errors='replace')[-2000:]}")


class SnapshotStore:
    """Snapshots kept under ``<state_dir>/snapshots``.

    Args:
        state_dir: the sidecar's private folder (created with mode 0700 when missing).
    """

    def __init__(self, state_dir: str) -> None:
        self.root = os.path.join(state_dir, "snapshots")

    def _folder(self, name: str) -> str:
        if not NAME_PATTERN.match(name):
            raise SnapshotError("invalid", f"snapshot name {name!r} must match {NAME_PATTERN.pattern}")
        return os.path.join(self.root, name)

    async def save(self, name: str, paths: list[str]) -> Saved:
        """Store `paths` (absolute) as snapshot `name`, replacing an older one of that name.

        Raises:
            SnapshotError: invalid name or paths, or tar failed.
        """
        folder = self._folder(name)
        if not paths or not all(os.path.isabs(path) for path in paths):
            raise SnapshotError("invalid", f"snapshot paths must be absolute and not empty, not {paths!r}")
        normalised = [os.path.normpath(path) for path in paths]
        present = [path for path in normalised if os.path.lexists(path)]
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        staging = f"{folder}.partial"
        await asyncio.to_thread(_remove, staging)
        os.makedirs(staging)
        archive = os.path.join(staging, "content.tar")
        members = [os.path.relpath(path, "/") for path in present]
        # -T /dev/null first: GNU tar refuses to create an archive of nothing otherwise.
        await _tar(
            "--create",
            "--file",
            archive,
            "--numeric-owner",
            "--directory",
            "/",
            "-T",
            "/dev/null",
            "--",
            *members,
        )
        with open(os.path.join(staging, "paths.json"), "w", encoding="utf-8") as out:
            json.dump({"paths": normalised, "present": present}, out)
        size_bytes = os.path.getsize(archive)
        await asyncio.to_thread(_remove, folder)
        os.replace(staging, folder)
        return Saved(size_bytes=size_bytes, method="tar")

    async def restore(self, name: str) -> list[str]:
        """Put snapshot `name` back; returns its paths.

        Raises:
            SnapshotError: no such snapshot (``not_found``), or tar failed.
        """
        folder = self._folder(name)
        try:
            with open(os.path.join(folder, "paths.json"), encoding="utf-8") as handle:
                saved = json.load(handle)
        except FileNotFoundError:
            raise SnapshotError("not_found", f"no snapshot named {name!r}") from None
        for path in saved["paths"]:
            await asyncio.to_thread(_remove, path)
        if saved["present"]:
            archive = os.path.join(folder, "content.tar")
            await _tar(
                "--extract", "--file", archive, "--numeric-owner", "--same-permissions", "--directory", "/"
            )
        return list(saved["paths"])
