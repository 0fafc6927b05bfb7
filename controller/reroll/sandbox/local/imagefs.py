"""The isolated `local` sandbox on a task's own image: its root file system, unpacked once.

The host view (`reroll.sandbox.local.rootview`: the host's ``/usr``, a minimal ``/etc``, the
workspace seeded from ``environment/workspace/``) is what a Dockerfile of `HONOURED` lines
only makes: ``FROM reroll/base:bookworm``, a COPY of ``workspace/`` into the working folder and a
WORKDIR naming that folder (the bundled examples'). A task whose Dockerfile does more (`unhonoured`:
a RUN, another COPY, an ENV, another base…), or that names an ``environment.docker_image``, runs
on its image instead (`reroll.sandbox.local.imagebuild.image_root`):

- the image is built by the docker backend's own builder (`reroll.sandbox.docker.images.task_image`:
  the same catalogue stand-ins, ``--image-map``, build cache and build limits), in Docker where its
  engine answers, else in buildah, daemonless (`reroll.sandbox.local.buildah`; `open_builder`,
  the setting ``image_builder`` chooses; the builds are `reroll.sandbox.local.imagebuild`, which
  loads the docker SDK: this module does not);
- its file system is exported once into reroll's cache, ``<cache>/rootfs/<image id>/root``, with
  every owner shifted by `IMAGE_ID_BASE` (a range no sandbox runs as), next to ``image.json``
  (the image's WORKDIR, USER and ENV). It is unpacked into a ``.partial-*`` folder and renamed
  into place with ``image.json`` written last, under a lock: a folder without a matching
  ``image.json`` (a crash, a half copy) is never used, it is removed and unpacked again;
- the sandbox mounts it as the read-only lower layer of an overlay whose writes land on its sized
  file system (`reroll.sandbox.local.isolated`), through an idmapped mount showing it owned by the
  sandbox's own range (`reroll.sandbox.local.identity`: the sandbox's root owns what root owned in
  the image, the agent's uid 1000 what uid 1000 did), so rollouts share one copy, not one identity.

A sandbox holds a shared lock on its image's copy while it runs (`hold`); ``reroll sandbox prune
--sandbox local`` removes the copies whose image neither Docker nor buildah still has, and half
copies, that no sandbox holds (`reroll.sandbox.local.imagebuild.prune_unpacked`): an unpacked
copy lives as long as its image.

Where neither Docker nor buildah can build, such a task is refused (`ImageUnavailableError`) with
the lines the host view cannot honour, why, and the fix (``--sandbox docker``, or install buildah);
a task the host view honours runs as before, with no builder.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from reroll_contracts.sandbox_paths import DEFAULT_WORKDIR

from reroll.cache import cache_dir
from reroll.sandbox.docker.catalogue import BASE_ALIAS
from reroll.sandbox.local.rootview import IMAGE_ID_BASE
from reroll.sandbox.spec import SandboxSpec

ROOTFS_FOLDER = "rootfs"
"""The cache's sub-folder of unpacked images, one ``<image id>/`` each."""
META_FILE = "image.json"
"""An unpacked image's description, written last: a folder without it is incomplete."""
FORMAT = 1
"""The layout of an unpacked image; one of another format is unpacked again."""
_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\b\s*(.*)$", re.DOTALL)
_SEEDED = re.compile(r"^(?:--\S+\s+)*\.?/?workspace/?(?:\.)?\s+(\S+)\s*$", re.IGNORECASE)
"""COPY/ADD arguments copying ``workspace/`` into one folder (the host view seeds it)."""
HONOURED = ("FROM reroll/base:bookworm", "COPY workspace/ <working folder>", "WORKDIR <working folder>")
"""What the host view makes of a Dockerfile (see the module docstring)."""


@dataclass(frozen=True)
class ImageRoot:
    """An image's root file system, unpacked for the local sandbox, and its process defaults."""

    root: Path
    """The unpacked file system (host path; owners shifted by `IMAGE_ID_BASE`)."""
    image: str
    """The image's tag."""
    image_id: str
    """The image's id (``sha256:…``)."""
    workdir: str
    """Its WORKDIR, `DEFAULT_WORKDIR` when unset."""
    user: str
    """Its USER (a name or a uid, no group), ``root`` when unset."""
    env: dict[str, str] = field(default_factory=dict)
    """Its ENV (PATH included)."""


def dockerfile_instructions(text: str) -> list[str]:
    """The instructions of a Dockerfile's `text`: continuation lines joined, comments and blank
    lines left out, each stripped."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole:
            logical.append(whole)
    if pending.strip():
        logical.append(pending.strip())
    return logical


def unhonoured(dockerfile_text: str, workdir: str | None) -> list[str]:
    """The instructions of a Dockerfile the host view cannot honour (see the module docstring),
    for a task whose working folder is `workdir` (None: `DEFAULT_WORKDIR`); ``[]`` when it
    honours them all."""
    folder = (workdir or DEFAULT_WORKDIR).rstrip("/") or "/"
    left = []
    for instruction in dockerfile_instructions(dockerfile_text):
        match = _INSTRUCTION.match(instruction)
        keyword, rest = (match[1].upper(), match[2].strip()) if match else ("", instruction)
        if keyword == "FROM" and rest.split()[:1] == [BASE_ALIAS] and len(rest.split()) == 1:
            continue
        seeded = _SEEDED.match(rest) if keyword in ("COPY", "ADD") else None
        if seeded and seeded[1].rstrip("/") in (folder, "."):
            continue
        if keyword == "WORKDIR" and rest.rstrip("/") == folder:
            continue
        if keyword in ("LABEL", "MAINTAINER", "EXPOSE", "CMD", "ENTRYPOINT"):
            continue  # metadata: the sandbox's own processes do not read it
        left.append(instruction)
    return left


def spec_unhonoured(spec: SandboxSpec) -> list[str]:
    """What of `spec`'s image the host view cannot honour: its Dockerfile's lines (`unhonoured`),
    or ``environment.docker_image`` when it names one other than reroll's base; ``[]``: the
    host view runs it as its image would."""
    if spec.build is not None:
        text = spec.build.dockerfile.read_text(encoding="utf-8", errors="replace")
        return unhonoured(text, spec.workdir)
    if spec.docker_image and spec.docker_image != BASE_ALIAS:
        return [f"environment.docker_image = {spec.docker_image}"]
    return []


def rootfs_folder(image_id: str) -> Path:
    """The cache folder of image `image_id`'s unpacked file system."""
    return cache_dir() / ROOTFS_FOLDER / image_id.removeprefix("sha256:")[:32]


def read_meta(folder: Path, image_id: str) -> ImageRoot | None:
    """The `ImageRoot` unpacked in `folder` for `image_id`; None when it is not complete (no
    readable `META_FILE`, another image's, another format, or no ``root/``)."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
        if meta.pop("format") != FORMAT or meta["image_id"] != image_id:
            return None
        meta["root"] = Path(meta["root"])
        found = ImageRoot(**meta)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if found.root == folder / "root" and found.root.is_dir() else None


def _lock_file(folder: Path) -> Path:
    """The lock file of the unpacked copy in `folder` (`cache_lock`'s, which the unpacking holds)."""
    return folder.with_name(f"{folder.name}.lock")


def hold(image: ImageRoot) -> IO[str]:
    """Take a shared lock on `image`'s unpacked copy for as long as the returned file stays open
    (a sandbox's lifetime): `reroll.sandbox.local.imagebuild.prune_unpacked` never removes a copy held so.

    Raises:
        OSError: the lock file cannot be opened.
    """
    handle = open(_lock_file(image.root.parent), "a")  # noqa: SIM115 - held until the sandbox stops
    fcntl.flock(handle, fcntl.LOCK_SH)
    return handle


def _remove(path: Path) -> None:
    """Delete `path` (a folder or a file), whatever its modes."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def shifted_filter(id_base: int) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]:
    """A `tarfile` extraction filter that shifts every owner by `id_base` and keeps modes (setuid,
    sticky) as they are, leaving out device files (the sandbox has its own ``/dev``) and refusing
    any member that would land outside the destination.

    The filter raises `tarfile.OutsideDestinationError` for an absolute or ``..`` name, a hard
    link to such a name, a member below a symbolic link or in the place of one already unpacked.
    """

    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        name = PurePosixPath(member.name)
        if name.is_absolute() or ".." in name.parts:
            raise tarfile.OutsideDestinationError(member, member.name)
        if member.islnk():
            link = PurePosixPath(member.linkname)
            if link.is_absolute() or ".." in link.parts:
                raise tarfile.OutsideDestinationError(member, member.linkname)
        if member.ischr() or member.isblk():
            return None
        parent = os.path.realpath(os.path.join(dest, str(name.parent)))
        if os.path.commonpath([parent, os.path.realpath(dest)]) != os.path.realpath(dest):
            raise tarfile.OutsideDestinationError(member, member.name)
        if os.path.islink(os.path.join(dest, member.name)):  # a file written over it would follow it
            raise tarfile.OutsideDestinationError(member, member.name)
        return member.replace(
            uid=member.uid + id_base, gid=member.gid + id_base, uname="", gname="", deep=False
        )

    return keep


def lay_out_overlay(folder: Path, image: ImageRoot, reachable: list[str], id_base: int) -> None:
    """Make the overlay's ``upper/`` and ``work/`` in `folder` (on the sandbox's sized file
    system): ``upper/`` owned and moded as the image's ``/``, and there, a copy of each folder
    of the image above a path in `reachable` (the agents folder, below ``/root`` when reroll's cache
    is root's), executable for all, so the agent's user can pass through it to that path; owners
    shifted from `IMAGE_ID_BASE` to the sandbox's `id_base`, as its idmapped lower shows them."""
    upper, work = folder / "upper", folder / "work"
    for made in (upper, work):
        made.mkdir(parents=True, exist_ok=True)
    shift = id_base - IMAGE_ID_BASE
    top = os.lstat(image.root)
    os.lchown(upper, top.st_uid + shift, top.st_gid + shift)
    upper.chmod(top.st_mode & 0o7777)
    for path in reachable:
        for parent in reversed(PurePosixPath(path).parents[:-1]):
            below = image.root / str(parent).lstrip("/")
            if below.is_symlink() or not below.is_dir():
                break  # bwrap makes a missing folder 0755
            info = os.lstat(below)
            copy = upper / str(parent).lstrip("/")
            copy.mkdir(exist_ok=True)
            os.lchown(copy, info.st_uid + shift, info.st_gid + shift)
            copy.chmod((info.st_mode & 0o7777) | 0o111)
