"""The image builder seam: what `reroll.sandbox.docker.images` needs of the engine that stores and
builds images (`ImageBuilder`), and Docker's (`DockerBuilder`). The local sandbox builds with
Docker where it answers, else with buildah (`reroll.sandbox.local.buildah.BuildahBuilder`, no
daemon): the same recipes, catalogue stand-ins, ``--image-map``, tags and build limits either way.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Protocol

import docker
import docker.errors
import requests
import urllib3
from reroll_contracts.errors import ImageBuildError, SandboxError

from reroll.sandbox.docker.conventions import ImageDefaults, image_defaults

MANAGED_LABEL = "reroll.managed"
"""The label of every image and container reroll makes (``reroll.managed=1``)."""


class ImageBuilder(Protocol):
    """An engine that stores images by tag and builds Dockerfiles (Docker, buildah)."""

    name: str
    """How build logs and errors name it (``docker``, ``buildah``)."""

    def exists(self, image: str) -> bool:
        """Whether `image` (a tag or an id) is stored here."""
        ...

    def adopt(self, image: str) -> bool:
        """Copy `image` here from another image store on this host that has it (never from a
        registry); whether it did. Lets a second builder reuse what the first one built.

        Raises nothing: a failed copy is False, and the caller builds the image itself.
        """
        ...

    def image_id(self, image: str) -> str:
        """The id (``sha256:…``) of the stored `image`.

        Raises:
            SandboxError: no such image.
        """
        ...

    def tag(self, image: str, alias: str) -> None:
        """Name the stored `image` `alias` too (``repository:tag``)."""
        ...

    def import_rootfs(
        self, tarball: Path, tag: str, env: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        """Store the root file system `tarball` (a tar of ``/``) as the image `tag`, with `env` and
        `labels`, ``bash`` its command.

        Raises:
            ImageBuildError: the import failed.
        """
        ...

    def build(self, what: str, timeout_seconds: float, context: Path, dockerfile: Path, tag: str) -> None:
        """Build `dockerfile` (a host file) on `context` (a host folder) as `tag`, labelled
        `MANAGED_LABEL`, cut at `timeout_seconds`.

        Raises:
            ImageBuildError: the build failed (naming `what`, with the log's end) or ran out of time.
        """
        ...

    def defaults(self, image: str) -> ImageDefaults:
        """The WORKDIR, USER and ENV of the stored `image`.

        Raises:
            SandboxError: no such image.
        """
        ...

    def rootfs(self, image: str) -> AbstractContextManager[IO[bytes]]:
        """A tar stream of `image`'s root file system (its files as a container of it has them),
        readable while the context is open.

        Raises:
            SandboxError: the image cannot be read.
        """
        ...


class DockerBuilder:
    """`ImageBuilder` on a Docker Engine (`client`, which the caller closes)."""

    name = "docker"

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    def exists(self, image: str) -> bool:
        """Whether the engine has `image`."""
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            return False
        return True

    def adopt(self, image: str) -> bool:
        """`ImageBuilder.adopt`: Docker is the store others adopt from; it adopts nothing."""
        return False

    def image_id(self, image: str) -> str:
        """`ImageBuilder.image_id`."""
        try:
            return str(self.client.images.get(image).id)
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(f"image {image} is not a local image") from exc

    def tag(self, image: str, alias: str) -> None:
        """`ImageBuilder.tag`."""
        repository, version = alias.rsplit(":", 1)
        self.client.images.get(image).tag(repository, version)

    def import_rootfs(
        self, tarball: Path, tag: str, env: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        """``docker import`` (`ImageBuilder.import_rootfs`)."""
        changes = [
            *(f"ENV {name}={value}" for name, value in env.items()),
            "LABEL " + " ".join(f"{name}={value}" for name, value in labels.items()),
            'CMD ["bash"]',
        ]
        repository, version = tag.rsplit(":", 1)
        try:
            self.client.api.import_image_from_file(
                str(tarball), repository=repository, tag=version, changes=changes
            )
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker import of {tag} failed: {exc}") from exc

    def build(self, what: str, timeout_seconds: float, context: Path, dockerfile: Path, tag: str) -> None:
        """``docker build`` (`ImageBuilder.build`). The limit is checked at each line of the
        build's output, and a build that prints nothing for that long is cut as well (the HTTP read
        timeout), so a build ends within twice the limit at worst; the daemon stops a build whose
        connection closes."""
        started = time.monotonic()
        output: list[str] = []
        overtime = overtime_error(self.name, what, timeout_seconds)
        try:
            stream = self.client.api.build(
                path=str(context),
                dockerfile=str(dockerfile),
                tag=tag,
                rm=True,
                forcerm=True,
                labels={MANAGED_LABEL: "1"},
                decode=True,
                timeout=timeout_seconds,
            )
            for chunk in stream:
                output.append(str(chunk.get("stream") or chunk.get("error") or ""))
                if "error" in chunk:
                    raise ImageBuildError(
                        f"docker build of {what} failed: {chunk['error']}\n{''.join(output)[-3000:]}"
                    )
                if time.monotonic() - started > timeout_seconds:
                    stream.close()
                    raise overtime
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker build of {what} failed: {exc}") from exc
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            if time.monotonic() - started >= timeout_seconds:
                raise overtime from exc
            raise ImageBuildError(f"docker build of {what} failed: {exc}") from exc

    def defaults(self, image: str) -> ImageDefaults:
        """`ImageBuilder.defaults` (``docker inspect``'s ``Config``)."""
        return image_defaults(self.client, image)

    @contextlib.contextmanager
    def rootfs(self, image: str) -> Iterator[IO[bytes]]:
        """``docker export`` of a (never started) container of `image` (`ImageBuilder.rootfs`).

        Raises:
            docker.errors.DockerException: the container could not be made or exported.
        """
        container = self.client.containers.create(image, command=["true"], labels={MANAGED_LABEL: "1"})
        try:
            yield io.BufferedReader(_ChunkReader(container.export()), buffer_size=1 << 20)
        finally:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)


def as_builder(engine: docker.DockerClient | ImageBuilder) -> ImageBuilder:
    """`engine` as an `ImageBuilder` (a Docker client is wrapped in `DockerBuilder`)."""
    return DockerBuilder(engine) if isinstance(engine, docker.DockerClient) else engine


def overtime_error(builder: str, what: str, timeout_seconds: float) -> ImageBuildError:
    """The error of a build of `what` by `builder` that ran out of its `timeout_seconds`."""
    return ImageBuildError(
        f"{builder} build of {what} took longer than its {timeout_seconds:g} s (the task's "
        f"environment.build_timeout_sec; on a slow or busy host, set REROLL_BUILD_TIMEOUT_MULTIPLIER)"
    )


class _ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (the Docker SDK's export)."""

    def __init__(self, chunks: Sequence[bytes] | Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        """Always: it is a stream to read."""
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        """Fill `buffer` from the next chunks; 0 at their end."""
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size
