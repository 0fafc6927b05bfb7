"""The catalogue of stand-in base images reroll builds with debootstrap, and how a task's ``FROM``
maps to one (no registry needed; `reroll.sandbox.docker.images` builds them).

- `CATALOGUE`: ``reroll/debian:<variant>-<hash>`` (alias ``reroll/debian:<variant>``), Debian
  bullseye (Python 3.9), bookworm and trixie, each without Python (minbase and CA certificates)
  and with it (``python3`` with its headers, venv, pip, ``python`` on PATH, pip allowed to install
  system-wide as in the official ``python`` images), and bookworm whose pip installs system-wide
  (``bookworm-pip-system``); and bookworm with the host's CPython 3.10 or 3.12 at ``/usr/local``
  (``bookworm-python3.10``, ``bookworm-python3.12``: `reroll.sandbox.docker.python_standin`),
  the minors no Debian release ships, available where the host has that CPython.
- `PUBLIC_BASES`: the public bases (``debian:trixie-slim``, ``ubuntu:24.04``…) each stands in for.

Nothing here talks to Docker: these are the decisions, tested without it (whether a host-Python
stand-in is available looks at the host's pyenv, `reroll.host.pythons.host_python`).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from reroll_contracts.errors import ImageUnavailableError

from reroll.host.pythons import PYENV_VERSIONS, host_python
from reroll.sandbox.docker import python_standin

_BASE_RECIPE = "debootstrap --variant=minbase; apt lists and caches removed; v1"
"""Changing how the base is made must change its hash: bump this text with the recipe."""

_COPY_LINE = re.compile(r"^\s*(?:COPY|ADD)\s+(?:--\S+\s+)*(?P<args>.+?)\s*$", re.IGNORECASE)


def without_copies_of(dockerfile: str, folders: frozenset[str]) -> str:
    """`dockerfile` without its COPY / ADD lines whose every source is one of the context's
    top-level `folders` (``COPY skills /root/.claude/skills`` for ``{"skills"}``, as BenchFlow
    strips them for ``no-skill``); a line copying other sources too is kept (its build then fails
    on the missing folder: visible)."""
    kept = []
    for line in dockerfile.splitlines():
        match = _COPY_LINE.match(line)
        try:
            args = shlex.split(match.group("args")) if match else []
        except ValueError:
            args = []
        sources = args[:-1]
        if sources and all(source.rstrip("/").removeprefix("./") in folders for source in sources):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def content_digest(*parts: bytes) -> str:
    """The first 12 hex digits of the sha256 of `parts` (each length-prefixed)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class Recipe:
    """What a debootstrapped image holds: a Debian `suite` and `packages` beyond minbase.

    `python` also removes the ``EXTERNALLY-MANAGED`` marker (PEP 668), so ``pip install`` works
    system-wide as in the official ``python`` images these stand in for. `pip_config` is written to
    ``/etc/pip.conf`` (read by every later pip, also one that apt installs in a task's Dockerfile).
    `host_python` (a minor, ``3.12``): the host's CPython of that minor is installed at
    ``/usr/local`` (`reroll.sandbox.docker.python_standin.install`).
    """

    suite: str
    packages: tuple[str, ...]
    python: bool = False
    pip_config: str = ""
    host_python: str = ""

    def digest(self) -> str:
        """12 hex digits of the suite, the packages, `pip_config`, the host's CPython
        (`reroll.sandbox.docker.python_standin.identity`, for a `host_python` recipe) and
        `_BASE_RECIPE` (changes with any)."""
        parts = [self.suite.encode(), _BASE_RECIPE.encode(), " ".join(self.packages).encode()]
        if self.pip_config:  # so the hashes of the recipes without one stay as they were
            parts.append(self.pip_config.encode())
        if self.host_python:
            parts.append(python_standin.identity(self.host_python).encode())
        return content_digest(*parts)


_WITH_PYTHON = (
    "ca-certificates",
    "python3",
    "python3-dev",
    "python3-venv",
    "python3-pip",
    "python-is-python3",
)
"""What the stand-ins of the official ``python`` images carry: the interpreter, venv and pip, and
its C headers (``Python.h``: the official images have them, and a task's ``pip install`` of a
package without a wheel for that Python compiles against them)."""
HOST_PYTHON_MINORS = ("3.10", "3.12")
"""The CPython minors no Debian release ships (`SUITE_PYTHON`) that the host's pyenv builds stand
in for: ``bookworm-python3.10`` and ``bookworm-python3.12``."""
CATALOGUE_REPO = "reroll/debian"
CATALOGUE: dict[str, Recipe] = {
    "bookworm": Recipe("bookworm", ("ca-certificates",)),
    "bookworm-python": Recipe("bookworm", _WITH_PYTHON, python=True),
    "trixie": Recipe("trixie", ("ca-certificates",)),
    "trixie-python": Recipe("trixie", _WITH_PYTHON, python=True),
    "bookworm-pip-system": Recipe(
        "bookworm", ("ca-certificates",), pip_config="[global]\nbreak-system-packages = true\n"
    ),
    "bullseye": Recipe("bullseye", ("ca-certificates",)),
    "bullseye-python": Recipe("bullseye", _WITH_PYTHON, python=True),
    **{
        f"bookworm-python{minor}": Recipe("bookworm", python_standin.PACKAGES, host_python=minor)
        for minor in HOST_PYTHON_MINORS
    },
}
"""The local catalogue, by variant: ``reroll/debian:<variant>``, built with debootstrap on first use.
``bookworm-pip-system`` is ``bookworm`` whose pip installs system-wide without
``--break-system-packages`` (``/etc/pip.conf``), as on Ubuntu 22.04, which has no PEP 668 marker.
``bookworm-python3.X`` carries the host's CPython 3.X (`HOST_PYTHON_MINORS`), where it has one
(`python_minor`)."""

PUBLIC_BASES: dict[str, str] = {
    **dict.fromkeys(
        ("debian:bookworm", "debian:bookworm-slim", "debian:12", "debian:12-slim", "debian:oldstable"),
        "bookworm",
    ),
    **dict.fromkeys(
        (
            "debian:trixie",
            "debian:trixie-slim",
            "debian:13",
            "debian:13-slim",
            "debian:stable",
            "debian:latest",
        ),
        "trixie",
    ),
    **dict.fromkeys(
        ("debian:bullseye", "debian:bullseye-slim", "debian:11", "debian:11-slim", "debian:oldoldstable"),
        "bullseye",
    ),
    **dict.fromkeys(("ubuntu:24.04", "ubuntu:noble"), "bookworm"),
    **dict.fromkeys(("ubuntu:22.04", "ubuntu:jammy"), "bookworm-pip-system"),
}
"""Public images (as Dockerfiles name them, also with a ``docker.io/`` or ``library/`` prefix) →
the catalogue variant that stands in for them when they are not local: same Debian release.
``python:3.X[-suffix]`` is not listed: the catalogue image with that Python minor stands in for
any of its forms (`catalogue_variant`, `SUITE_PYTHON`). Ubuntu has no equal here; Debian
bookworm stands in for it (SkillsBench tasks start ``FROM ubuntu:24.04`` and apt-get install
``python3-pip``): apt works as on Ubuntu (Debian's archive: ``main`` only, no ``universe``; a
few package names differ), its ``python3`` is 3.11 where Ubuntu 24.04 has 3.12 and 22.04 has
3.10 (wheels pinned for those mostly exist for 3.11 too; trixie's 3.13 lacks many older pins),
and pip refuses system installs without ``--break-system-packages`` (PEP 668) as on 24.04, but
not for ``ubuntu:22.04``, as there (see `CATALOGUE`). Other bases (``ubuntu:20.04``, and
``python:3.10`` or ``python:3.12`` on a host without that CPython) have no equal: map them
yourself (``--image-map``; `suggested_target` says to what)."""

SUITE_PYTHON: dict[str, str] = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
"""The CPython minor version of each Debian suite's ``python3`` (what a catalogue image with
Python carries; its build labels the image ``reroll.python`` with what it found)."""

BASE_REPO = "reroll/base"
BASE_ALIAS = f"{BASE_REPO}:bookworm"
"""reroll's base image (`reroll.sandbox.docker.images.ensure_images`): bookworm with python3,
venv and pytest, no pip."""

_PYTHON_IMAGE = re.compile(r"python:(3\.\d+)(?:\.\d+)?(?:-[a-z0-9][a-z0-9._-]*)?")
"""The official ``python`` image at a minor version: ``python:3.13``, ``python:3.13.1-slim``,
``python:3.11-slim-bookworm``… (group 1: the minor, ``3.13``)."""
_USES_PYTHON = re.compile(r"\b(?:pip[0-9.]*|python[0-9.]*|ensurepip)\b", re.IGNORECASE)
_FROM_LINE = re.compile(r"^\s*FROM\s.*$", re.IGNORECASE | re.MULTILINE)


def _official(image: str) -> str:
    """`image` without a ``docker.io/``, ``docker.io/library/`` or ``library/`` prefix."""
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        image = image.removeprefix(prefix)
    return image


def python_minor(variant: str) -> str | None:
    """The CPython minor (``3.13``) the catalogue `variant` carries with venv and pip, or None; a
    host-Python variant's only where the host has that CPython (`host_python`), so that nothing
    stands in with an image that cannot be built here."""
    recipe = CATALOGUE[variant]
    if recipe.host_python:
        return recipe.host_python if host_python(recipe.host_python) is not None else None
    return SUITE_PYTHON.get(recipe.suite) if recipe.python else None


def buildable_here(variant: str) -> bool:
    """Whether the catalogue `variant` can be built on this host: all can but a host-Python one
    whose CPython the host lacks (`python_minor`)."""
    return not CATALOGUE[variant].host_python or python_minor(variant) is not None


def requested_python(image: str) -> str | None:
    """The minor (``3.12``) of an official ``python:3.X[.Y][-suffix]`` `image`, else None."""
    match = _PYTHON_IMAGE.fullmatch(_official(image))
    return match[1] if match else None


def catalogue_variant(image: str) -> str | None:
    """The catalogue variant standing in for the public `image`, or None: `PUBLIC_BASES`, and for
    any ``python:3.X[-suffix]`` the variant carrying CPython 3.X (whatever Debian the suffix names):
    Debian's own where a release ships 3.X, else the host's (``bookworm-python3.12``) where the
    host has it."""
    image = _official(image)
    if minor := requested_python(image):
        return next((variant for variant in CATALOGUE if python_minor(variant) == minor), None)
    return PUBLIC_BASES.get(image)


def catalogue_tag(variant: str) -> str:
    """``reroll/debian:<variant>-<hash>`` of the catalogue `variant` (a key of `CATALOGUE`)."""
    return f"{CATALOGUE_REPO}:{variant}-{CATALOGUE[variant].digest()}"


def catalogue_target(image: str) -> str | None:
    """The catalogue variant `image` names (``reroll/debian:<variant>``, or this recipe's
    ``reroll/debian:<variant>-<hash>``), so that it is built rather than pulled; else None."""
    for variant in CATALOGUE:
        if image in (f"{CATALOGUE_REPO}:{variant}", catalogue_tag(variant)):
            return variant
    return None


def standins(bases: Iterable[str], is_local: Callable[[str], bool]) -> dict[str, str]:
    """The catalogue variant to build for each of `bases` (a Dockerfile's FROM images after the
    image map) that needs one: a catalogue image named (`catalogue_target`), built on demand
    whether or not it is local (a build of an up-to-date one is a look-up), and a public base
    with a stand-in (`catalogue_variant`) that is not local (`is_local`: a local image of the
    public name wins)."""
    plan: dict[str, str] = {}
    for image in bases:
        if (variant := catalogue_target(image)) or (
            (variant := catalogue_variant(image)) and not is_local(image)
        ):
            plan[image] = variant
    return plan


def _alias(variant: str) -> str:
    return f"{CATALOGUE_REPO}:{variant}"


def _python_variants() -> list[tuple[int, str]]:
    """``(minor, variant)`` of the catalogue images with Python, by minor (``(13, "trixie-python")``)."""
    found = [(variant, python_minor(variant)) for variant in CATALOGUE]
    return sorted((int(minor.split(".")[1]), variant) for variant, minor in found if minor)


def suggested_target(image: str, dockerfile: str = "") -> str:
    """An ``--image-map`` target that works for `image` in `dockerfile` (the text; ``""`` for a
    prebuilt ``docker_image``): for ``python:3.X`` the catalogue image of the nearest minor not
    older (else the newest), for a Dockerfile that runs pip or python the catalogue's
    ``bookworm-python`` (pip allowed system-wide), else reroll's base image."""
    variants = _python_variants()
    if minor := requested_python(image):
        wanted = int(minor.split(".")[1])
        newer = [variant for number, variant in variants if number >= wanted]
        return _alias(newer[0] if newer else variants[-1][1])
    if _USES_PYTHON.search(_FROM_LINE.sub("", dockerfile)):
        return _alias("bookworm-python")
    return BASE_ALIAS


def unavailable_error(images: list[str], dockerfile: Path, text: str, cause: str) -> ImageUnavailableError:
    """The error for the Dockerfile `dockerfile` (its `text`) whose FROM `images` are not local
    and could not be pulled (Docker said `cause`): the remedies, with a mapping that works
    (`suggested_target`)."""
    first = images[0]
    target = suggested_target(first, text)
    why = ""
    if minor := requested_python(first):
        carried = ", ".join(f"{python_minor(v)} ({_alias(v)})" for _, v in _python_variants())
        lacking = (
            f" (reroll installs the host's CPython {minor} where it has one, and this host has none: "
            f"pyenv's under {PYENV_VERSIONS}, or python{minor} on PATH)"
            if minor in HOST_PYTHON_MINORS
            else ""
        )
        why = (
            f"{first} asks for Python {minor}, which no catalogue image carries{lacking} (they have "
            f"{carried}); the nearest works for most code: "
        )
    return ImageUnavailableError(
        f"{dockerfile} starts FROM {', '.join(images)}, which is not a local image and could not be "
        f"pulled (no registry reachable?). {why}map it with one flag: reroll run … --image-map "
        f"{first}={target} (run, job, continue, continue-job, replay and branch take it; a job file's "
        f"sandbox_config: {{image_map: …}}; a catalogue image named there is built on first use), or "
        f"build or tag it locally (docker build -t {first} …, or docker tag IMAGE {first}). reroll's "
        f"catalogue stands in for common Debian, Ubuntu and python:3.X bases by itself "
        f"({', '.join(sorted(CATALOGUE))}: reroll/debian:VARIANT). Docker said: {cause[-500:]}"
    )
