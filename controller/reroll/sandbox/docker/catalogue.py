"""The catalogue of stand-in base images reroll builds with debootstrap, and how a task's ``FROM``
maps to one (no registry needed; `reroll.sandbox.docker.images` builds them).

- `CATALOGUE`: ``reroll/debian:<variant>-<hash>`` (alias ``reroll/debian:<variant>``), Debian
  bookworm and trixie, each without Python (minbase and CA certificates) and with it (``python3``,
  venv, pip, ``python`` on PATH, pip allowed to install system-wide as in the official ``python``
  images), and bookworm whose pip installs system-wide (``bookworm-pip-system``).
- `PUBLIC_BASES`: the public bases (``debian:trixie-slim``, ``ubuntu:24.04``…) each stands in for.

Nothing here talks to Docker: these are the decisions, tested without it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

_BASE_RECIPE = "debootstrap --variant=minbase; apt lists and caches removed; v1"
"""Changing how the base is made must change its hash: bump this text with the recipe."""


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
    """

    suite: str
    packages: tuple[str, ...]
    python: bool = False
    pip_config: str = ""

    def digest(self) -> str:
        """12 hex digits of the suite, the packages, `pip_config` and `_BASE_RECIPE` (changes with any)."""
        parts = [self.suite.encode(), _BASE_RECIPE.encode(), " ".join(self.packages).encode()]
        if self.pip_config:  # so the hashes of the recipes without one stay as they were
            parts.append(self.pip_config.encode())
        return content_digest(*parts)


_WITH_PYTHON = ("ca-certificates", "python3", "python3-venv", "python3-pip", "python-is-python3")
CATALOGUE_REPO = "reroll/debian"
CATALOGUE: dict[str, Recipe] = {
    "bookworm": Recipe("bookworm", ("ca-certificates",)),
    "bookworm-python": Recipe("bookworm", _WITH_PYTHON, python=True),
    "trixie": Recipe("trixie", ("ca-certificates",)),
    "trixie-python": Recipe("trixie", _WITH_PYTHON, python=True),
    "bookworm-pip-system": Recipe(
        "bookworm", ("ca-certificates",), pip_config="[global]\nbreak-system-packages = true\n"
    ),
}
"""The local catalogue, by variant: ``reroll/debian:<variant>``, built with debootstrap on first use.
``bookworm-pip-system`` is ``bookworm`` whose pip installs system-wide without
``--break-system-packages`` (``/etc/pip.conf``), as on Ubuntu 22.04, which has no PEP 668 marker."""

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
        ("python:3.11", "python:3.11-bookworm", "python:3.11-slim", "python:3.11-slim-bookworm"),
        "bookworm-python",
    ),
    **dict.fromkeys(
        ("python:3.13", "python:3.13-trixie", "python:3.13-slim", "python:3.13-slim-trixie"),
        "trixie-python",
    ),
    **dict.fromkeys(("ubuntu:24.04", "ubuntu:noble"), "bookworm"),
    **dict.fromkeys(("ubuntu:22.04", "ubuntu:jammy"), "bookworm-pip-system"),
}
"""Public images (as Dockerfiles name them, also with a ``docker.io/`` or ``library/`` prefix) →
the catalogue variant that stands in for them when they are not local: same Debian release, same
Python minor version. Ubuntu has no equal here; Debian bookworm stands in for it (SkillsBench
tasks start ``FROM ubuntu:24.04`` and apt-get install ``python3-pip``): apt works as on Ubuntu
(Debian's archive: ``main`` only, no ``universe``; a few package names differ), its ``python3`` is
3.11 where Ubuntu 24.04 has 3.12 and 22.04 has 3.10 (wheels pinned for those mostly exist for
3.11 too; trixie's 3.13 lacks many older pins), and pip refuses system installs without
``--break-system-packages`` (PEP 668) as on 24.04, but not for ``ubuntu:22.04``, as there (see
`CATALOGUE`). Other bases (``ubuntu:20.04``, ``python:3.12``) have no equal: map them yourself
(``--image-map``)."""


def catalogue_variant(image: str) -> str | None:
    """The catalogue variant standing in for the public `image`, or None (see `PUBLIC_BASES`)."""
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        image = image.removeprefix(prefix)
    return PUBLIC_BASES.get(image)


def catalogue_tag(variant: str) -> str:
    """``reroll/debian:<variant>-<hash>`` of the catalogue `variant` (a key of `CATALOGUE`)."""
    return f"{CATALOGUE_REPO}:{variant}-{CATALOGUE[variant].digest()}"
