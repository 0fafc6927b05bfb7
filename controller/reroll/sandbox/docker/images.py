"""Build the images of the `docker` backend, and of the `local` sandbox on a task's image, without
any registry, in an image builder (`reroll.sandbox.docker.builder.ImageBuilder`: Docker's engine,
or buildah where no Docker answers; every function takes a Docker client or a builder).

- ``reroll/base:<hash>`` (alias ``reroll/base:bookworm``): a Debian bookworm root file system made
  with debootstrap from the host's Debian mirror (packages in ``reroll/images/base/packages.txt``),
  then imported (``docker import``, ``buildah commit``). Needs root and the ``debootstrap`` package
  (installed with apt-get if missing).
  Tasks without a Dockerfile run in it; it is tagged with a hash of what it is built from, so a
  rebuild is skipped when nothing changed.
- ``reroll/debian:<variant>-<hash>`` (alias ``reroll/debian:<variant>``), the catalogue
  (`reroll.sandbox.docker.catalogue`), built the same way on first use (the ``python:3.10`` and
  ``python:3.12`` stand-ins then get the host's CPython: `reroll.sandbox.docker.python_standin`).
  A task Dockerfile ``FROM``
  a common public base that is not local is built from its catalogue image instead, and the build
  log says so; ``--image-map`` chooses otherwise.
- ``reroll/task-<name>:<hash>``: a task's ``environment/Dockerfile`` (often ``FROM reroll/base:bookworm``),
  as it is: reroll adds nothing to it (its context may be elsewhere: ``environment.build``, Harbor's
  compose ``main`` service's ``build``).
- ``reroll/task-<name>-<service>:<hash>``: the image of a task service that has a ``build``
  (compose's ``build`` of a service other than the sandbox), built the same way (`service_image`).

The sidecar is not part of any image: the docker backend mounts the self-contained sidecar bundle
(`reroll.sandbox.sidecar_bundle`) into every container.

Every image carries the label ``reroll.managed=1``. Each image's build holds that image's file lock,
so concurrent rollouts build it once, and one of the host's build slots (``$REROLL_IMAGE_BUILDS``,
default 2: `reroll.cache.image_builds`), so different images build at once, a bounded number.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import docker
import docker.errors
import requests
from reroll_contracts.errors import ImageBuildError, ImageUnavailableError

from reroll.cache import cache_lock, cache_slot, host_ca_bundle, image_builds
from reroll.sandbox.base import HOST_CA_VARIABLES
from reroll.sandbox.docker import python_standin
from reroll.sandbox.docker.builder import MANAGED_LABEL as MANAGED_LABEL  # re-exported
from reroll.sandbox.docker.builder import DockerBuilder, ImageBuilder, as_builder
from reroll.sandbox.docker.catalogue import (
    BASE_ALIAS as BASE_ALIAS,  # re-exported: where callers have always found it
)
from reroll.sandbox.docker.catalogue import (
    BASE_REPO,
    CATALOGUE,
    CATALOGUE_REPO,
    Recipe,
    catalogue_tag,
    content_digest,
    standins,
    suggested_target,
    unavailable_error,
    without_copies_of,
)
from reroll.sandbox.sidecar_bundle import BUILD_TIMEOUT_SECONDS, run_build_step
from reroll.sandbox.spec import SandboxSpec, SiblingService

IMAGES = resources.files("reroll") / "images"
"""reroll's own image recipes (package data): ``base/packages.txt``."""
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
COMMAND_TIMEOUT_SECONDS = BUILD_TIMEOUT_SECONDS
IMPORTED_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
"""The ENV of the debootstrapped images (the base and the catalogue's)."""

Log = Callable[[str], None]
"""Where build steps are reported, one line each; the default is this module's logger (INFO)."""
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Images:
    """The tag of the base image, and the images built just now."""

    base: str
    built: tuple[str, ...]


def _tree_bytes(root: Path, leave_out: frozenset[str] = frozenset()) -> Iterator[bytes]:
    """Relative path, mode and content of every file under `root`, sorted; caches and the
    top-level folders named in `leave_out` left out."""
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.relative_to(root).parts[0] in leave_out:
            continue
        yield f"{path.relative_to(root).as_posix()}:{path.stat().st_mode & 0o777:o}".encode()
        yield path.read_bytes()


def _top_level(root: Path, names: frozenset[str]) -> Callable[[str, list[str]], set[str]]:
    """A `shutil.copytree` ``ignore`` leaving out the folders `names` right under `root`."""
    return lambda folder, entries: set(entries) & names if Path(folder) == root else set()


def run_step(argv: list[str], what: str, log: Log) -> str:
    """Run a host command, logged first (`run_build_step`: at most `COMMAND_TIMEOUT_SECONDS`);
    its standard output.

    Raises:
        ImageBuildError: it failed or timed out; the message names `what` and quotes its output's end.
    """
    log(f"$ {' '.join(argv[:6])}{' …' if len(argv) > 6 else ''}")
    return run_build_step(argv, what)


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


def base_recipe() -> Recipe:
    """The base image's recipe: bookworm with ``reroll/images/base/packages.txt``."""
    return Recipe(SUITE, tuple(_packages()))


def base_tag() -> str:
    """``reroll/base:<hash>`` of the package list and the recipe."""
    return f"{BASE_REPO}:{base_recipe().digest()}"


def _ensure_debootstrap(log: Log) -> str:
    if found := shutil.which("debootstrap"):
        return found
    if os.geteuid() != 0:
        raise ImageBuildError(
            "debootstrap is missing and installing it needs root: apt-get install debootstrap"
        )
    log("installing debootstrap with apt-get")
    run_step(["apt-get", "update", "-qq"], "apt-get update", log)
    run_step(["apt-get", "install", "-y", "-qq", "debootstrap"], "apt-get install debootstrap", log)
    found = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(found).exists():
        raise ImageBuildError("apt-get installed debootstrap but it is not on PATH")
    return found


def _debootstrap_image(builder: ImageBuilder, tag: str, recipe: Recipe, log: Log) -> None:
    """debootstrap `recipe` and import it into `builder` as `tag`.

    Raises:
        ImageBuildError: not root, debootstrap failed (with its log's end), or the import failed.
    """
    if os.geteuid() != 0:
        raise ImageBuildError(f"building {tag} runs debootstrap, which needs root")
    debootstrap = _ensure_debootstrap(log)
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(prefix="reroll-rootfs-") as workdir:
        root = Path(workdir) / "root"
        log(f"debootstrap {recipe.suite} from {mirror} for {tag} (a few minutes)")
        argv = [debootstrap, "--variant=minbase", f"--include={','.join(recipe.packages)}"]
        run_step([*argv, recipe.suite, str(root), mirror], "debootstrap", log)
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        labels = {MANAGED_LABEL: "1"}
        if "python3" in recipe.packages:
            python = run_step(
                ["chroot", str(root), "python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                "python3 in the root file system",
                log,
            ).strip()
            labels["reroll.python"] = python
            if recipe.python:
                (root / f"usr/lib/python{python}/EXTERNALLY-MANAGED").unlink(missing_ok=True)
        if recipe.pip_config:
            (root / "etc/pip.conf").write_text(recipe.pip_config)
        if recipe.host_python:
            python_standin.install(root, recipe.host_python, log)
            labels["reroll.python"] = recipe.host_python
        tarball = Path(workdir) / "rootfs.tar"
        run_step(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(tarball), "."],
            "tar of the root file system",
            log,
        )
        log(f"{builder.name} import as {tag}")
        builder.import_rootfs(tarball, tag, IMPORTED_ENV, labels)


def _image_lock(tag: str) -> AbstractContextManager[None]:
    """The lock of building the image `tag` (in any builder), so that concurrent rollouts build it once."""
    return cache_lock(f"images/{_slug(tag)}")


def _build_slot() -> AbstractContextManager[int]:
    """One of the host's `reroll.cache.image_builds` build slots (blocking until one is free).

    Raises:
        ConfigError: ``$REROLL_IMAGE_BUILDS`` is not a whole number of at least 1.
    """
    return cache_slot("images/builds", image_builds())


def ensure_catalogue(engine: docker.DockerClient | ImageBuilder, variant: str, log: Log = logger.info) -> str:
    """The tag of the catalogue image `variant` in `engine` (a Docker client or another
    `ImageBuilder`), built first if missing (and aliased ``reroll/debian:<variant>``).

    Raises:
        ImageBuildError: a build step failed.
    """
    builder = as_builder(engine)
    tag = catalogue_tag(variant)
    with _image_lock(tag):
        if not builder.exists(tag) and not builder.adopt(tag):
            with _build_slot():
                _debootstrap_image(builder, tag, CATALOGUE[variant], log)
        builder.tag(tag, f"{CATALOGUE_REPO}:{variant}")
    return tag


def ensure_images(engine: docker.DockerClient | ImageBuilder, log: Log = logger.info) -> Images:
    """Build the base image in `engine` (a Docker client or another `ImageBuilder`) unless it
    exists; returns its tag.

    Raises:
        ImageBuildError: a build step failed.
    """
    builder = as_builder(engine)
    built: list[str] = []
    base = base_tag()
    with _image_lock(base):
        if not builder.exists(base) and not builder.adopt(base):
            with _build_slot():
                _debootstrap_image(builder, base, base_recipe(), log)
            built.append(base)
        builder.tag(base, BASE_ALIAS)
    return Images(base=base, built=tuple(built))


_FROM = re.compile(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)
"""A Dockerfile's FROM line: the keyword and its flags, the image, the rest (``AS name``)."""


def map_from_lines(dockerfile: str, image_map: Mapping[str, str]) -> tuple[str, list[str]]:
    """`dockerfile` with the images of its FROM lines replaced per `image_map`, and the images it
    then starts from (stage names and ``scratch`` left out)."""
    stages: set[str] = set()
    bases: list[str] = []

    def replace(match: re.Match[str]) -> str:
        image = image_map.get(match[2], match[2])
        if image.lower() != "scratch" and image not in stages and "$" not in image:
            bases.append(image)
        if alias := re.match(r"\s+AS\s+(\S+)", match[3], re.IGNORECASE):
            stages.add(alias[1])
        return f"{match[1]}{image}{match[3]}"

    return _FROM.sub(replace, dockerfile), bases


BUILD_CA_FILE = ".reroll-host-ca.pem"
"""The host's CA bundle, put into a task image's build context (see `trust_host_ca`)."""
BUILD_CA_PATH = "/etc/reroll/build-ca.pem"


def trust_host_ca(dockerfile: str) -> str:
    """`dockerfile` with the host's CA bundle trusted after every FROM line: copied from the build
    context (`BUILD_CA_FILE`) to `BUILD_CA_PATH`, named by ``PIP_CERT``, ``SSL_CERT_FILE`` and
    ``REQUESTS_CA_BUNDLE``. So ``pip install`` in a task's Dockerfile works where the host reaches
    PyPI through a TLS-intercepting proxy, as installs, agents and verifiers do
    (`reroll.sandbox.base.trust_host_ca`)."""
    trust = (
        f"COPY {BUILD_CA_FILE} {BUILD_CA_PATH}\n"
        f"ENV {' '.join(f'{name}={BUILD_CA_PATH}' for name in HOST_CA_VARIABLES)}"
    )
    return _FROM.sub(lambda match: f"{match[0]}\n{trust}", dockerfile)


def _with_standins(
    builder: ImageBuilder, dockerfile: str, image_map: Mapping[str, str], log: Log
) -> dict[str, str]:
    """`image_map`, completed so that each FROM image (after the map) that needs a catalogue image
    (`reroll.sandbox.docker.catalogue.standins`: one named, or a public base with a stand-in that
    is not local) is replaced by that catalogue image's tag, built first if missing."""
    _, bases = map_from_lines(dockerfile, image_map)
    built = {
        image: ensure_catalogue(builder, variant, log)
        for image, variant in standins(dict.fromkeys(bases), builder.exists).items()
    }
    for image, tag in built.items():
        if not image.startswith(CATALOGUE_REPO):
            log(f"FROM {image} is not a local image: reroll's catalogue image {tag} stands in")
    return {**built, **{source: built.get(target, target) for source, target in image_map.items()}}


def local_images() -> Callable[[str], bool]:
    """Whether an image is local to this host's Docker Engine; every image is not when the engine
    cannot be reached (nothing can be built then). Each answer opens and closes its own client,
    so no socket is left for the garbage collector."""
    return _is_local


def _is_local(image: str) -> bool:
    """`local_images`' answer for `image`."""
    try:
        with contextlib.closing(docker.from_env()) as client:
            return DockerBuilder(client).exists(image)
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        return False


def base_warnings(spec: SandboxSpec, is_local: Callable[[str], bool]) -> list[str]:
    """One line for each image `spec`'s sandbox starts from (its Dockerfile's FROM images, or its
    ``docker_image``) that has no stand-in here: not local (`is_local`), not reroll's
    own, and no catalogue image stands in for it; with the ``--image-map`` that would work."""
    if spec.build is not None:
        text = spec.build.dockerfile.read_text(encoding="utf-8", errors="replace")
        _, bases = map_from_lines(text, {})
    else:
        text, bases = "", [spec.docker_image or BASE_ALIAS]
    return [
        f"FROM {image}: no stand-in here (not a local image, none in reroll's catalogue); without a "
        f"registry it does not build: --image-map {image}={suggested_target(image, text)}"
        for image in dict.fromkeys(bases)
        if not image.startswith((f"{BASE_REPO}:", f"{CATALOGUE_REPO}:"))
        and not standins([image], is_local)
        and not is_local(image)
    ]


def _slug(name: str) -> str:
    """`name` as a Docker repository name's last part."""
    return re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.") or "task"


def task_image(
    engine: docker.DockerClient | ImageBuilder,
    spec: SandboxSpec,
    base: str,
    log: Log = logger.info,
    image_map: Mapping[str, str] | None = None,
) -> str:
    """The image a sandbox's container runs: its Dockerfile's image, built in `engine` (a Docker
    client or another `ImageBuilder`) when missing.

    A spec without a Dockerfile (`reroll.sandbox.spec.SandboxSpec.build`) runs its
    ``docker_image`` (mapped per `image_map`; it must be local), else `base` itself. The build
    leaves the build's ``hidden`` folders out of its context, and the COPY lines of them alone
    (`reroll.sandbox.docker.catalogue.without_copies_of`). How it is built: `build_image`.

    Raises:
        ImageUnavailableError: the build failed and a FROM image is not local (cannot be pulled),
            or the task's ``docker_image`` is not local.
        ImageBuildError: the task's Dockerfile failed to build otherwise (the message carries the
            log), or building a catalogue image failed.
    """
    builder = as_builder(engine)
    if spec.build is None:
        declared = spec.docker_image
        if declared is None:
            return base
        mapped = (image_map or {}).get(declared, declared)
        image = _with_standins(builder, f"FROM {mapped}", {}, log).get(mapped, mapped)
        if not builder.exists(image):
            raise ImageUnavailableError(
                f"task {spec.name} runs the prebuilt image {image} (environment.docker_image), which is "
                f"not a local image. Remedies: map it with one flag: reroll run … --image-map "
                f"{declared}={suggested_target(declared)} (a catalogue image named there is built on "
                f"first use), or build or tag it locally (docker tag IMAGE {image})"
            )
        return image
    return build_image(
        builder,
        BuildRequest(
            repository=f"reroll/task-{_slug(spec.name)}",
            context=spec.build.context,
            dockerfile=spec.build.dockerfile,
            timeout_seconds=spec.build_timeout_seconds,
            hidden=spec.build.hidden,
        ),
        base,
        log,
        image_map,
    )


def service_image(
    engine: docker.DockerClient | ImageBuilder,
    spec: SandboxSpec,
    service: SiblingService,
    base: str,
    log: Log = logger.info,
    image_map: Mapping[str, str] | None = None,
) -> str:
    """The image of `spec`'s sibling `service` that has a ``build`` (compose's ``build`` of a
    service other than the sandbox): ``reroll/task-<task>-<service>:<hash>``, built by
    `build_image` like the sandbox's own (same cache, label, stand-ins, CA and build timeout).

    Raises:
        ImageUnavailableError, ImageBuildError: as `task_image`.
        ValueError: `service` has no ``build``.
    """
    if service.build is None:
        raise ValueError(f"service {service.name} has no build")
    return build_image(
        engine,
        BuildRequest(
            repository=f"reroll/task-{_slug(spec.name)}-{_slug(service.name)}",
            context=service.build.context,
            dockerfile=service.build.dockerfile,
            timeout_seconds=spec.build_timeout_seconds,
        ),
        base,
        log,
        image_map,
    )


@dataclass(frozen=True)
class BuildRequest:
    """One Dockerfile to build (`build_image`)."""

    repository: str
    """The image's repository; its tag is a hash of what it is built from."""
    context: Path
    """The build context: a host folder, copied (never written to)."""
    dockerfile: Path
    """The Dockerfile (a host file, usually in `context`)."""
    timeout_seconds: float
    """The build's time limit (the task's ``environment.build_timeout_sec``)."""
    hidden: frozenset[str] = frozenset()
    """Top-level folders left out of the context, and the Dockerfile's COPY lines of them alone."""


def build_image(
    engine: docker.DockerClient | ImageBuilder,
    request: BuildRequest,
    base: str,
    log: Log = logger.info,
    image_map: Mapping[str, str] | None = None,
) -> str:
    """Build `request` unless an image of the same content exists; returns its tag
    ``<repository>:<12 hex digits>``, a hash of `base`, the Dockerfile as built, the host's CA
    bundle and every file (path, mode, content) of the context.

    The images of the Dockerfile's FROM lines are first replaced per `image_map` (source →
    replacement), then a common public base that is not local by its catalogue image
    (`PUBLIC_BASES`); each stage then trusts the host's CA bundle (`trust_host_ca`), when the host
    has one. The build holds the image's lock, so concurrent rollouts build it once, and a build slot
    (`_build_slot`): the time limit starts once it has one.

    Raises:
        ImageUnavailableError: the build failed and a FROM image is not local (cannot be pulled).
        ImageBuildError: the Dockerfile failed to build otherwise (the message carries the log),
            or building a catalogue image failed.
    """
    builder = as_builder(engine)
    context = request.context
    written = request.dockerfile.read_text(encoding="utf-8")
    leave_out = request.hidden
    if leave_out:
        written = without_copies_of(written, leave_out)
    dockerfile, bases = map_from_lines(written, _with_standins(builder, written, image_map or {}, log))
    ca_bundle = host_ca_bundle()
    ca = ca_bundle.read_bytes() if ca_bundle is not None else b""
    if ca:
        dockerfile = trust_host_ca(dockerfile)
    files = _tree_bytes(context, leave_out)
    tag = f"{request.repository}:{content_digest(base.encode(), dockerfile.encode(), ca, *files)}"
    with _image_lock(tag):
        if builder.exists(tag) or builder.adopt(tag):
            return tag
        log(f"{builder.name} build {request.dockerfile}")
        with _build_slot(), tempfile.TemporaryDirectory(prefix="reroll-dockerfile-") as folder:
            build_context = Path(folder) / "context"  # a copy, so the task's folder is not written to
            shutil.copytree(context, build_context, symlinks=True, ignore=_top_level(context, leave_out))
            (build_context / BUILD_CA_FILE).write_bytes(ca)
            mapped = Path(folder) / "Dockerfile"  # outside the context: the SDK sends it along
            mapped.write_text(dockerfile, encoding="utf-8")
            try:
                builder.build(str(request.dockerfile), request.timeout_seconds, build_context, mapped, tag)
            except ImageBuildError as exc:
                missing = [image for image in bases if not builder.exists(image)]
                if missing:
                    raise unavailable_error(missing, request.dockerfile, written, str(exc)) from exc
                raise
    return tag
