"""The daemonless image builder of the `local` sandbox: Debian's ``buildah`` (bookworm: 1.28),
an `reroll.sandbox.docker.builder.ImageBuilder` that builds a task's Dockerfile where no Docker
Engine answers (`reroll.sandbox.local.imagefs`).

- It runs as root with buildah's own storage (``/var/lib/containers/storage``, its default
  driver: overlay where the kernel has it, else vfs) and ``--isolation chroot``: a RUN line runs
  chrooted in the build's file system, in namespaces of its own but with the host's network, so
  it needs neither runc nor cgroups (v1 or v2) nor a daemon.
- reroll's catalogue stand-ins and base image are the same debootstrapped root file systems as
  Docker's (`reroll.sandbox.docker.images`: the same recipes, hashes and tags), imported here
  (``buildah from scratch``, ``add``, ``config``, ``commit``), or copied from the local Docker
  Engine where it has them already (``buildah pull docker-daemon:``, `BuildahBuilder.adopt`);
  ``--image-map`` and the build time limit apply as on Docker.
- Images are named as on Docker (``reroll/task-<name>:<hash>``; buildah shows them under
  ``localhost/``) and labelled ``reroll.managed=1``; ``buildah images`` lists them and
  ``buildah rmi`` removes them.

A base that is neither local nor stood in for is pulled per ``/etc/containers/registries.conf``
(Debian's names no registry for a short name such as ``ubuntu:20.04``: map it with ``--image-map``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from reroll_contracts.errors import ImageBuildError, SandboxError

from reroll.sandbox.docker.builder import MANAGED_LABEL, overtime_error
from reroll.sandbox.docker.conventions import ImageDefaults, defaults_of
from reroll.sandbox.docker.engine import docker_unreachable
from reroll.sandbox.docker.images import COMMAND_TIMEOUT_SECONDS, run_step

INSTALL = "apt-get install buildah"
"""How to install buildah on Debian (``scripts/install-sandbox-tools`` runs it, as root)."""
logger = logging.getLogger(__name__)


def buildah_missing() -> str:
    """Why buildah cannot build here ("" when it can): not on PATH, or not root (reroll runs it
    with root's storage)."""
    if shutil.which("buildah") is None:
        return f"buildah is not installed ({INSTALL})"
    if os.geteuid() != 0:
        return "buildah builds only as root here"
    return ""


def _buildah(args: list[str], what: str) -> str:
    """Run ``buildah ARGS`` (logged at debug level); its standard output.

    Raises:
        ImageBuildError: it failed or ran out of time (naming `what`, with the end of its output).
    """
    return run_step(["buildah", *args], what, logger.debug)


class BuildahBuilder:
    """`reroll.sandbox.docker.builder.ImageBuilder` on the ``buildah`` command (see the module
    docstring)."""

    name = "buildah"

    def exists(self, image: str) -> bool:
        """Whether buildah's storage has `image` (never pulls)."""
        done = subprocess.run(
            ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
            capture_output=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
        )
        return done.returncode == 0

    def adopt(self, image: str) -> bool:
        """Copy `image` from the local Docker Engine when one answers and has it (``buildah pull
        docker-daemon:IMAGE``: its layers read through the daemon's socket, no registry), so the
        images Docker already built (reroll's base and catalogue, a task's) are not built again
        (`ImageBuilder.adopt`)."""
        if docker_unreachable():  # ``DOCKER_HOST`` honoured, as by buildah's docker-daemon transport
            return False
        try:
            _buildah(["pull", "--quiet", f"docker-daemon:{image}"], f"buildah pull docker-daemon:{image}")
        except ImageBuildError as exc:  # Docker has no such image, or does not answer
            logger.debug("not adopted from Docker: %s", exc)
            return False
        return self.exists(image)

    def _inspect(self, image: str) -> dict[str, object]:
        """``buildah inspect`` of the stored `image`.

        Raises:
            SandboxError: no such image.
        """
        try:
            found = json.loads(_buildah(["inspect", "--type", "image", image], f"buildah inspect {image}"))
        except (ImageBuildError, ValueError) as exc:
            raise SandboxError(f"image {image} is not in buildah's storage: {exc}") from exc
        return dict(found)

    def image_id(self, image: str) -> str:
        """`ImageBuilder.image_id`."""
        return f"sha256:{self._inspect(image)['FromImageID']}"

    def tag(self, image: str, alias: str) -> None:
        """`ImageBuilder.tag`."""
        _buildah(["tag", image, alias], f"buildah tag {image} {alias}")

    def import_rootfs(
        self, tarball: Path, tag: str, env: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        """``buildah from scratch``, ``add``, ``config`` and ``commit`` (`ImageBuilder.import_rootfs`)."""
        container = _buildah(["from", "scratch"], "buildah from scratch").strip()
        try:
            _buildah(["add", container, str(tarball), "/"], f"buildah add of {tag}'s root file system")
            settings = [
                *(f"--env={name}={value}" for name, value in env.items()),
                *(f"--label={name}={value}" for name, value in labels.items()),
            ]
            _buildah(["config", *settings, "--cmd", "bash", container], f"buildah config of {tag}")
            _buildah(["commit", "--quiet", "--format", "docker", container, tag], f"buildah commit of {tag}")
        finally:
            with contextlib.suppress(ImageBuildError):
                _buildah(["rm", container], f"buildah rm {container}")

    def build(self, what: str, timeout_seconds: float, context: Path, dockerfile: Path, tag: str) -> None:
        """``buildah bud --isolation chroot`` (`ImageBuilder.build`); at `timeout_seconds` the
        build's whole process group is stopped (`_stop_group`)."""
        argv = ["buildah", "bud", "--isolation", "chroot", "--format", "docker", "--layers=false"]
        argv += [f"--label={MANAGED_LABEL}=1", "--tag", tag, "--file", str(dockerfile), str(context)]
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            output, _ = process.communicate(timeout=timeout_seconds)
        except subprocess.TimeoutExpired as exc:
            _stop_group(process)
            raise overtime_error(self.name, what, timeout_seconds) from exc
        if process.returncode != 0:
            raise ImageBuildError(
                f"buildah build of {what} failed (exit {process.returncode}):\n{output[-3000:]}"
            )

    def defaults(self, image: str) -> ImageDefaults:
        """`ImageBuilder.defaults` (the image's OCI config)."""
        oci = self._inspect(image).get("OCIv1")
        config = oci.get("config") if isinstance(oci, dict) else None
        return defaults_of(config if isinstance(config, dict) else {})

    @contextlib.contextmanager
    def rootfs(self, image: str) -> Iterator[IO[bytes]]:
        """A tar of a (never run) working container of `image`, mounted (`ImageBuilder.rootfs`).

        Raises:
            SandboxError: the container could not be made or mounted, or the tar failed.
        """
        try:
            container = _buildah(["from", "--pull=never", "--quiet", image], f"buildah from {image}").strip()
        except ImageBuildError as exc:
            raise SandboxError(str(exc)) from exc
        try:
            mount = _buildah(["mount", container], f"buildah mount of {image}").strip()
            tar = subprocess.Popen(
                ["tar", "--numeric-owner", "-C", mount, "-cf", "-", "."], stdout=subprocess.PIPE
            )
            stream = tar.stdout
            if stream is None:  # never: stdout=PIPE
                raise SandboxError("tar gave no output stream")
            try:
                yield stream
            finally:
                stream.close()
                if tar.wait(timeout=COMMAND_TIMEOUT_SECONDS) not in (0, -signal.SIGPIPE):
                    raise SandboxError(f"tar of {image}'s file system failed (exit {tar.returncode})")
        except ImageBuildError as exc:
            raise SandboxError(str(exc)) from exc
        finally:
            with contextlib.suppress(ImageBuildError):
                _buildah(["rm", container], f"buildah rm {container}")

    def image_ids(self) -> set[str]:
        """The ids (``sha256:…``) of every image in buildah's storage."""
        listed = _buildah(["images", "--all", "--no-trunc", "--format", "{{.ID}}"], "buildah images")
        return {line.strip() for line in listed.splitlines() if line.strip()}


STOP_GRACE_SECONDS = 10.0
"""How long a build cut at its limit has after SIGTERM to remove its working container."""


def _stop_group(process: subprocess.Popen[str]) -> None:
    """End `process` (a session leader) and its process group: SIGTERM, on which buildah removes
    its working container, then SIGKILL after `STOP_GRACE_SECONDS` (a working container may be
    left then: ``buildah containers`` lists it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.communicate(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
