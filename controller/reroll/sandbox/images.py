"""Build the Docker images of the `docker` backend without any registry.

Three layers, each tagged with a hash of what it is built from, so a rebuild is skipped when
nothing changed:

- ``reroll/base:<hash>`` (alias ``reroll/base:bookworm``): a Debian bookworm root file system made
  with debootstrap from the host's Debian mirror (packages in ``reroll/images/base/packages.txt``), then
  ``docker import``-ed. Needs root and the ``debootstrap`` package (installed with apt-get if missing).
- ``reroll/sandbox:<hash>``: the base plus the sidecar in ``/opt/reroll`` (``reroll/images/sandbox/``),
  built offline (``network_mode=none``) from grpcio/protobuf wheels downloaded on the host first.
  The recipes and the sidecar's packages are read with ``importlib.resources``, so an installed
  wheel builds the same images as a checkout.
- ``reroll/task-<name>:<hash>``: a task's ``environment/Dockerfile`` (usually ``FROM reroll/base:bookworm``)
  with ``/opt/reroll`` copied in from the sandbox image.

Every image carries the label ``reroll.managed=1``. All builds hold a file lock, so concurrent
rollouts build each image once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata, resources
from importlib.resources.abc import Traversable
from pathlib import Path

import docker
import docker.errors
from docker.models.images import Image

from reroll.config import cache_dir, cache_lock
from reroll.errors import ImageBuildError
from reroll.tasks import Task

IMAGES = resources.files("reroll") / "images"
"""reroll's own image recipes (package data): ``base/packages.txt`` and ``sandbox/Dockerfile``."""
SUITE = "bookworm"
BASE_REPO = "reroll/base"
BASE_ALIAS = f"{BASE_REPO}:{SUITE}"
SANDBOX_REPO = "reroll/sandbox"
MANAGED_LABEL = "reroll.managed"
SIDECAR_ENTRYPOINT = ["/opt/reroll/venv/bin/python", "-m", "reroll_sidecar"]
DEFAULT_MIRROR = "http://deb.debian.org/debian"
_BASE_RECIPE = "debootstrap --variant=minbase; apt lists and caches removed; v1"
"""Changing how the base is made must change its hash: bump this text with the recipe."""
_SIDECAR_LIB: dict[str, tuple[str, ...] | None] = {
    "reroll_sidecar": None,
    "reroll_protos": None,
    "reroll": ("__init__.py", "errors.py"),
}
"""What the sandbox image's ``/opt/reroll/lib`` holds: package → its files (None: all of them).
Of ``reroll`` the sidecar needs only the exception tree, which imports nothing."""
COMMAND_TIMEOUT_SECONDS = 1800

Log = Callable[[str], None]
"""Where build steps are reported, one line each; the default is this module's logger (INFO)."""
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Images:
    """The tags of the base and sandbox images, and which of them were built just now."""

    base: str
    sandbox: str
    built: tuple[str, ...]


def _digest(*parts: bytes) -> str:
    """The first 12 hex digits of the sha256 of `parts` (each length-prefixed)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:12]


def _tree_bytes(root: Path) -> Iterator[bytes]:
    """Relative path, mode and content of every file under `root`, sorted; caches left out."""
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        yield f"{path.relative_to(root).as_posix()}:{path.stat().st_mode & 0o777:o}".encode()
        yield path.read_bytes()


def _resource_files(root: Traversable, prefix: str = "") -> Iterator[tuple[str, bytes]]:
    """Relative path and content of every file of package data under `root`, sorted; caches left out.

    Modes are not part of package data (a wheel may install them differently), so none are read.
    """
    for child in sorted(root.iterdir(), key=lambda item: item.name):
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            yield from _resource_files(child, f"{prefix}{child.name}/")
        else:
            yield f"{prefix}{child.name}", child.read_bytes()


def _resource_bytes(root: Traversable) -> Iterator[bytes]:
    """`_resource_files` of `root` flattened for `_digest`: path, then content, per file."""
    for name, content in _resource_files(root):
        yield name.encode()
        yield content


def _copy_resources(root: Traversable, dest: Path) -> None:
    """Write the files of package data under `root` below `dest` (caches left out)."""
    for name, content in _resource_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _run(argv: list[str], what: str, log: Log) -> str:
    """Run a host command; raise ImageBuildError naming `what` with the end of its output."""
    log(f"$ {' '.join(argv[:6])}{' …' if len(argv) > 6 else ''}")
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageBuildError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        raise ImageBuildError(
            f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return done.stdout


def debian_mirror() -> str:
    """The Debian mirror: ``$REROLL_DEBIAN_MIRROR``, else the host's apt sources, else deb.debian.org."""
    if env := os.environ.get("REROLL_DEBIAN_MIRROR"):
        return env
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = source.read_text()
            # deb822 (.sources): "URIs: URL" in a stanza naming the suite; one-line: "deb URL SUITE main".
            for stanza in text.split("\n\n"):
                uris = re.search(r"^URIs:\s*(\S+)", stanza, re.MULTILINE)
                suites = re.search(r"^Suites:(.*)$", stanza, re.MULTILINE)
                if uris and suites and SUITE in suites.group(1).split() and "security" not in uris.group(1):
                    return uris.group(1)
            if match := re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", text, re.MULTILINE):
                return match.group(1)
    return DEFAULT_MIRROR


def _packages() -> list[str]:
    lines = IMAGES.joinpath("base", "packages.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def base_tag() -> str:
    """``reroll/base:<hash>`` of the package list and the recipe."""
    return f"{BASE_REPO}:{_digest(SUITE.encode(), _BASE_RECIPE.encode(), ' '.join(_packages()).encode())}"


def _ensure_debootstrap(log: Log) -> str:
    if found := shutil.which("debootstrap"):
        return found
    if os.geteuid() != 0:
        raise ImageBuildError(
            "debootstrap is missing and installing it needs root: apt-get install debootstrap"
        )
    log("installing debootstrap with apt-get")
    _run(["apt-get", "update", "-qq"], "apt-get update", log)
    _run(["apt-get", "install", "-y", "-qq", "debootstrap"], "apt-get install debootstrap", log)
    found = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(found).exists():
        raise ImageBuildError("apt-get installed debootstrap but it is not on PATH")
    return found


def build_base(client: docker.DockerClient, log: Log) -> str:
    """debootstrap a bookworm root file system and import it as `base_tag`; returns the tag.

    Raises:
        ImageBuildError: not root, debootstrap failed (with its log's end), or the import failed.
    """
    tag = base_tag()
    if os.geteuid() != 0:
        raise ImageBuildError("building the base image runs debootstrap, which needs root")
    debootstrap = _ensure_debootstrap(log)
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(prefix="reroll-rootfs-") as workdir:
        root = Path(workdir) / "root"
        log(f"debootstrap {SUITE} from {mirror} (a few minutes)")
        _run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(_packages())}",
                SUITE,
                str(root),
                mirror,
            ],
            "debootstrap",
            log,
        )
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        python = _run(
            ["chroot", str(root), "python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            "python3 in the root file system",
            log,
        ).strip()
        tarball = Path(workdir) / "rootfs.tar"
        _run(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(tarball), "."],
            "tar of the root file system",
            log,
        )
        log(f"docker import as {tag}")
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            f"LABEL {MANAGED_LABEL}=1 reroll.python={python}",
            'CMD ["bash"]',
        ]
        repository, version = tag.split(":")
        try:
            client.api.import_image_from_file(
                str(tarball), repository=repository, tag=version, changes=changes
            )
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker import of the base image failed: {exc}") from exc
    return tag


def _wheels(python: str, log: Log) -> Path:
    """grpcio and protobuf wheels (the host's versions) for CPython `python` ("3.11"), cached."""
    pins = [f"{name}=={metadata.version(name)}" for name in ("grpcio", "protobuf")]
    arch = platform.machine()
    dest = cache_dir() / "wheels" / f"cp{python.replace('.', '')}-{arch}-{'-'.join(pins)}".replace("==", "")
    if (dest / ".complete").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in (36, 34, 28, 17)] + [f"manylinux2014_{arch}"]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest)]
    argv += ["--python-version", python, "--implementation", "cp"]
    for tag in platforms:
        argv += ["--platform", tag]
    _run([*argv, *pins], f"pip download {' '.join(pins)} for Python {python}", log)
    (dest / ".complete").touch()
    return dest


def sandbox_tag(base: str, wheels_key: str) -> str:
    """``reroll/sandbox:<hash>`` of the base tag, the wheel pins, the Dockerfile and the sidecar's source."""
    parts = [base.encode(), wheels_key.encode(), *_resource_bytes(IMAGES / "sandbox")]
    for relative, content in _sidecar_lib():
        parts += [relative.encode(), content]
    return f"{SANDBOX_REPO}:{_digest(*parts)}"


def _sidecar_lib() -> list[tuple[str, bytes]]:
    """(path under ``lib/``, content) of every file of `_SIDECAR_LIB` (package data, caches left out)."""
    files = []
    for package, names in _SIDECAR_LIB.items():
        root = resources.files(package)
        if names is None:
            files += [(f"{package}/{name}", content) for name, content in _resource_files(root)]
        else:
            files += [(f"{package}/{name}", root.joinpath(name).read_bytes()) for name in names]
    return files


def _python_of(client: docker.DockerClient, base: str) -> str:
    labels = client.images.get(base).labels or {}
    return str(labels.get("reroll.python", "3.11"))


def build_sandbox(client: docker.DockerClient, base: str, log: Log) -> tuple[str, bool]:
    """Build the sandbox image on `base`, offline, unless it exists.

    Returns:
        Its tag, and whether it was built just now.

    Raises:
        ImageBuildError: the wheels could not be downloaded, or the build failed (with its log's end).
    """
    wheels = _wheels(_python_of(client, base), log)
    tag = sandbox_tag(base, wheels.name)
    if _exists(client, tag):
        return tag, False
    with tempfile.TemporaryDirectory(prefix="reroll-sandbox-ctx-") as context:
        _copy_resources(IMAGES / "sandbox", Path(context))
        shutil.copytree(wheels, Path(context) / "wheels", ignore=shutil.ignore_patterns(".complete"))
        for relative, content in _sidecar_lib():
            target = Path(context) / "lib" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        log(f"docker build {tag} (offline)")
        _build(client, tag, path=context, tag=tag, buildargs={"BASE": base}, network_mode="none")
    return tag, True


def _build(client: docker.DockerClient, what: str, **kwargs: object) -> Image:
    """``docker build`` with reroll's label; errors name `what` and carry the log's end."""
    try:
        image, _ = client.images.build(rm=True, forcerm=True, labels={MANAGED_LABEL: "1"}, **kwargs)
    except docker.errors.BuildError as exc:
        output = "".join(str(item.get("stream") or item.get("error") or "") for item in exc.build_log)
        raise ImageBuildError(f"docker build of {what} failed: {exc.msg}\n{output[-3000:]}") from exc
    except docker.errors.APIError as exc:
        raise ImageBuildError(f"docker build of {what} failed: {exc}") from exc
    return image


def ensure_images(client: docker.DockerClient, log: Log = logger.info) -> Images:
    """Build the base and sandbox images unless they exist; returns their tags.

    Raises:
        ImageBuildError: a build step failed.
    """
    built: list[str] = []
    with cache_lock("images"):
        base = base_tag()
        if not _exists(client, base):
            build_base(client, log)
            built.append(base)
        client.images.get(base).tag(BASE_REPO, SUITE)
        sandbox, fresh = build_sandbox(client, base, log)
        if fresh:
            built.append(sandbox)
    return Images(base=base, sandbox=sandbox, built=tuple(built))


def task_image(client: docker.DockerClient, task: Task, sandbox: str, log: Log = logger.info) -> str:
    """The image a task's containers run: its Dockerfile's image plus ``/opt/reroll``, built when missing.

    A task without ``environment/Dockerfile`` runs in the sandbox image itself.

    Raises:
        ImageBuildError: the task's Dockerfile failed to build (the message carries the log).
    """
    if task.dockerfile is None:
        return sandbox
    context = task.dockerfile.parent
    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
    tag = f"reroll/task-{slug}:{_digest(sandbox.encode(), *_tree_bytes(context))}"
    with cache_lock("images"):
        if _exists(client, tag):
            return tag
        log(f"docker build {task.dockerfile}")
        own = _build(client, str(task.dockerfile), path=str(context), tag=f"{tag}-env")
        overlay = (
            f"FROM {own.id}\nCOPY --from={sandbox} /opt/reroll /opt/reroll\n"
            f"ENTRYPOINT {json.dumps(SIDECAR_ENTRYPOINT)}\n"
        )
        _build(client, f"{tag} (the sidecar layer)", fileobj=io.BytesIO(overlay.encode()), tag=tag)
    return tag
