"""The isolated `local` sandbox's task images, built and unpacked (`reroll.sandbox.local.imagefs`
describes the scheme): the builder (Docker's engine, else buildah: `open_builder`), the image
built and unpacked into reroll's cache (`image_root`), the sandbox settled on it (`settle`),
``reroll sandbox prune``'s removal of copies whose image is gone (`prune_unpacked`), and the
refusal where neither can build (`refusal`, `no_builder`).

Its own module because it loads the docker SDK: a sandbox whose task the host view honours (the
bundled examples, every fork of a branch from its pool) imports only `reroll.sandbox.local.imagefs`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shutil
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path

import docker
import docker.errors
import requests
from reroll_contracts.errors import ImageUnavailableError, SandboxError

from reroll.cache import cache_dir, cache_lock
from reroll.sandbox.base import Sandbox
from reroll.sandbox.docker.builder import DockerBuilder, ImageBuilder, as_builder
from reroll.sandbox.docker.conventions import SETUP_SCRIPT
from reroll.sandbox.docker.engine import docker_unreachable
from reroll.sandbox.docker.images import ensure_images, task_image
from reroll.sandbox.layout import SandboxLayout
from reroll.sandbox.local.buildah import INSTALL as BUILDAH_INSTALL
from reroll.sandbox.local.buildah import BuildahBuilder, buildah_missing
from reroll.sandbox.local.imagefs import (
    FORMAT,
    HONOURED,
    META_FILE,
    ROOTFS_FOLDER,
    ImageRoot,
    _lock_file,
    _remove,
    read_meta,
    rootfs_folder,
    shifted_filter,
    spec_unhonoured,
)
from reroll.sandbox.local.rootview import IMAGE_ID_BASE
from reroll.sandbox.local.settings import BuilderChoice
from reroll.sandbox.spec import SandboxSpec


def refusal(spec: SandboxSpec, lines: list[str], reason: str) -> str:
    """The message refusing `spec` on local where its image cannot be built (`reason`)."""
    where = str(spec.build.dockerfile) if spec.build is not None else f"task {spec.name}"
    shown = "; ".join(line if len(line) <= 120 else line[:117] + "..." for line in lines[:5])
    more = f" and {len(lines) - 5} more" if len(lines) > 5 else ""
    return (
        f"{where} needs its image ({shown}{more}): the local sandbox runs the task's image only where "
        f"Docker or buildah builds it, and {reason}; its host view honours only {', '.join(HONOURED)}. "
        f"Fix: run it with --sandbox docker, or install buildah here ({BUILDAH_INSTALL}, as root; "
        "or Docker): the local sandbox then builds the image and runs on its file system"
    )


def no_builder(choice: BuilderChoice = "auto") -> str:
    """Why no image builder of `choice` can build here (`open_builder`); "" when one can."""
    docker_reason = (
        docker_unreachable() if choice != "buildah" else "Docker is not used (image_builder buildah)"
    )
    if not docker_reason:
        return ""
    buildah_reason = buildah_missing() if choice != "docker" else "buildah is not used (image_builder docker)"
    return "" if not buildah_reason else f"{docker_reason} and {buildah_reason}"


@contextlib.contextmanager
def open_builder(spec: SandboxSpec, choice: BuilderChoice = "auto") -> Iterator[ImageBuilder]:
    """The image builder for `spec`'s image: Docker where its engine answers (unless `choice` is
    ``buildah``), else buildah (unless `choice` is ``docker``).

    Raises:
        ImageUnavailableError: neither can build (the message names the lines, why, and the fix).
    """
    if choice != "buildah" and not docker_unreachable():
        with contextlib.closing(docker.from_env()) as client:
            yield DockerBuilder(client)
    elif reason := no_builder(choice):
        raise ImageUnavailableError(refusal(spec, spec_unhonoured(spec), reason))
    else:
        yield BuildahBuilder()


def image_root(
    spec: SandboxSpec, image_map: Mapping[str, str] | None = None, builder: BuilderChoice = "auto"
) -> ImageRoot:
    """`spec`'s image, built when missing (`task_image`, by the builder `open_builder` chooses)
    and unpacked when not yet (`unpacked`), for a spec the host view cannot honour (`spec_unhonoured`).

    Raises:
        ImageUnavailableError: no builder can build here (the message names the lines and the fix),
            or an image the build needs is not local.
        ImageBuildError: the Dockerfile failed to build.
        SandboxError: exporting or unpacking the image failed.
    """
    with open_builder(spec, builder) as engine:
        base = ensure_images(engine).base
        tag = task_image(engine, spec, base, image_map=image_map)
        return unpacked(engine, tag, engine.image_id(tag))


def image_layout(
    spec: SandboxSpec,
    layout: SandboxLayout,
    image_map: Mapping[str, str] | None = None,
    builder: BuilderChoice = "auto",
) -> tuple[ImageRoot, SandboxLayout]:
    """`spec`'s image (`image_root`, built by `builder`) and `layout` on it: the spec's working
    folder, else the image's WORKDIR, as docker's (nothing is bound there: ``/root`` holding the
    agents folder is fine), and the image's ENV.

    Raises:
        ImageUnavailableError, ImageBuildError, SandboxError: as `image_root`.
    """
    image = image_root(spec, image_map, builder)
    workspace = spec.workdir or image.workdir
    return image, dataclasses.replace(layout, workspace=workspace, image_env=image.env)


def unpacked(engine: docker.DockerClient | ImageBuilder, tag: str, image_id: str) -> ImageRoot:
    """Image `tag`'s file system in the cache (`rootfs_folder`), unpacked first from `engine` (a
    Docker client or an image builder) unless a complete copy is there; a folder that is not
    complete is removed and unpacked again.

    Raises:
        SandboxError: the export or the unpacking failed (nothing is left in the cache).
    """
    folder = rootfs_folder(image_id)
    found = read_meta(folder, image_id)
    if found is not None:
        return found
    with cache_lock(f"{ROOTFS_FOLDER}/{folder.name}"):
        found = read_meta(folder, image_id)
        if found is not None:
            return found
        partial = folder.with_name(f".partial-{folder.name}-{secrets.token_hex(4)}")
        try:
            partial.mkdir(parents=True, mode=0o700)
            builder = as_builder(engine)
            defaults = builder.defaults(tag)
            _export(builder, tag, partial / "root")
            found = ImageRoot(folder / "root", tag, image_id, defaults.workdir, defaults.user, defaults.env)
            meta = {**asdict(found), "root": str(found.root), "format": FORMAT}
            (partial / META_FILE).write_text(json.dumps(meta, indent=1))
            if folder.exists() or folder.is_symlink():
                _remove(folder)  # incomplete: read_meta refused it
            os.rename(partial, folder)
        except (OSError, tarfile.TarError, docker.errors.DockerException, requests.RequestException) as exc:
            raise SandboxError(f"cannot unpack image {tag} for the local sandbox: {exc}") from exc
        finally:
            if partial.exists():
                _remove(partial)
    return found


def prune_unpacked() -> list[str]:
    """Remove the unpacked copies (`rootfs_folder`) whose image is gone (neither Docker nor
    buildah has it) and the half copies (``.partial-*``) of unpackings no longer running, skipping
    any a sandbox holds (`hold`) or an unpacking is writing; nothing when an installed Docker does
    not answer, or when neither Docker answers nor buildah is installed (a copy's image cannot be
    told from a gone one then).

    Returns:
        The folders removed.
    """
    root = cache_dir() / ROOTFS_FOLDER
    unreachable = docker_unreachable()
    if not root.is_dir() or (unreachable and (shutil.which("docker") or buildah_missing())):
        return []
    folders = [
        folder
        for folder in sorted(root.iterdir())
        if folder.suffix != ".lock" and not folder.is_symlink() and folder.is_dir()
    ]
    copies = {folder.name for folder in folders if not folder.name.startswith(".partial-")}
    present = _present(copies, docker_answers=not unreachable)
    removed = []
    for folder in folders:
        partial = folder.name.startswith(".partial-")
        if not partial and folder.name in present:
            continue
        lock = _lock_file(root / folder.name.split("-")[1]) if partial else _lock_file(folder)
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a sandbox runs on it, or it is being unpacked
            _remove(folder)
        if not partial:
            lock.unlink(missing_ok=True)
        removed.append(str(folder))
    return removed


def _present(names: set[str], docker_answers: bool) -> set[str]:
    """Which of `names` (cache folder names: `rootfs_folder`'s) name an image Docker has (when it
    `docker_answers`) or buildah has (asked only when Docker lacks one, and buildah is installed)."""
    ids: set[str] = set()
    if docker_answers:
        with contextlib.closing(docker.from_env()) as client:
            ids = {str(image.id) for image in client.images.list(all=True)}
    if names - {image_id.removeprefix("sha256:")[:32] for image_id in ids} and not buildah_missing():
        ids |= BuildahBuilder().image_ids()
    return names & {image_id.removeprefix("sha256:")[:32] for image_id in ids}


def _export(builder: ImageBuilder, tag: str, root: Path) -> None:
    """Unpack the file system of image `tag` (`ImageBuilder.rootfs`) into `root` (made here).

    Raises:
        docker.errors.DockerException, SandboxError: the image could not be read.
        OSError, tarfile.TarError: the unpacking failed.
    """
    root.mkdir(mode=0o755)
    with builder.rootfs(tag) as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
        archive.extractall(root, numeric_owner=True, filter=shifted_filter(IMAGE_ID_BASE))
    os.lchown(root, IMAGE_ID_BASE, IMAGE_ID_BASE)  # docker's archive has no entry for "/"


async def settle(sandbox: Sandbox, spec: SandboxSpec, image: ImageRoot, timeout_seconds: float) -> None:
    """Make `sandbox` (started on `image`) follow the image as the docker backend's container does:
    run `SETUP_SCRIPT` for the agent's user (the spec's, else the image's USER) and working folder,
    set the layout's user and HOME from it, and seed the workspace from the spec's
    ``workspace_seed`` when the image is not built from a Dockerfile (a ``docker_image``).

    Raises:
        SandboxError: the setup failed.
    """
    layout = sandbox.layout
    user = spec.agent_user or image.user
    setup = await sandbox.exec(
        ["sh", "-c", SETUP_SCRIPT, "setup", user, layout.workspace], timeout_seconds=timeout_seconds
    )
    if setup.exit_code != 0:
        raise SandboxError(f"setting up the image's user failed: {setup.output_text()[-2000:]}")
    name, home = setup.stdout.decode().split()[-2:]
    sandbox.layout = dataclasses.replace(layout, home=home, agent_user="" if name == "root" else name)
    if spec.build is None and spec.workspace_seed is not None:
        await sandbox.upload_dir(spec.workspace_seed, layout.workspace)
        if name != "root":
            await sandbox.exec(["chown", "-R", f"{name}:", layout.workspace])


def local_warnings(spec: SandboxSpec, unreachable: str) -> list[str]:
    """``reroll task check``'s warning for a task the default ``local`` sandbox would refuse here:
    its image is needed (`spec_unhonoured`) and cannot be built (`unreachable`: why no builder
    can build here, `no_builder`; "" when one can); ``[]`` otherwise."""
    lines = spec_unhonoured(spec)
    return [refusal(spec, lines, unreachable)] if lines and unreachable else []
