"""The catalogue of stand-in base images (`reroll.sandbox.docker.catalogue`): which public base
each stands in for, and its tags. No Docker needed. Which CPythons the host has (for the
``python:3.10`` and ``python:3.12`` stand-ins) is set per test with `host_pythons` (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from reroll.sandbox.docker import python_standin
from reroll.sandbox.docker.catalogue import (
    CATALOGUE,
    HOST_PYTHON_MINORS,
    PUBLIC_BASES,
    Recipe,
    buildable_here,
    catalogue_tag,
    catalogue_target,
    catalogue_variant,
    python_minor,
    standins,
    suggested_target,
    unavailable_error,
    without_copies_of,
)

Host = Callable[..., None]


def test_catalogue_variant_knows_public_bases_under_every_spelling(host_pythons: Host) -> None:
    host_pythons("3.10.13", "3.12.1")
    assert catalogue_variant("python:3.13-slim") == "trixie-python"
    assert catalogue_variant("docker.io/library/debian:bookworm-slim") == "bookworm"
    assert catalogue_variant("library/debian:13") == "trixie"
    assert catalogue_variant("ubuntu:20.04") is None
    assert catalogue_variant("debian:bullseye-slim") == catalogue_variant("debian:11") == "bullseye"
    assert set(PUBLIC_BASES.values()) | {v for v in CATALOGUE if python_minor(v)} == set(CATALOGUE)


def test_ubuntu_is_stood_in_for_by_bookworm_and_22_04_pip_installs_system_wide() -> None:
    """SkillsBench's ``FROM ubuntu:24.04`` (PEP 668: ``pip install --break-system-packages``) and
    ``ubuntu:22.04`` (plain ``pip install``): bookworm, the second with pip allowed system-wide."""
    assert (
        catalogue_variant("ubuntu:24.04") == catalogue_variant("docker.io/library/ubuntu:noble") == "bookworm"
    )
    assert catalogue_variant("ubuntu:22.04") == catalogue_variant("ubuntu:jammy") == "bookworm-pip-system"
    system_wide = CATALOGUE["bookworm-pip-system"]
    assert system_wide.suite == "bookworm" and "break-system-packages = true" in system_wide.pip_config
    assert not CATALOGUE["bookworm"].pip_config  # 24.04: apt's pip keeps its EXTERNALLY-MANAGED marker


def test_a_catalogue_tag_changes_with_its_recipe() -> None:
    assert catalogue_tag("trixie").startswith("reroll/debian:trixie-")
    recipe = CATALOGUE["trixie"]
    assert Recipe(recipe.suite, (*recipe.packages, "git")).digest() != recipe.digest()
    assert Recipe("bookworm", recipe.packages).digest() != recipe.digest()
    assert Recipe(recipe.suite, recipe.packages, pip_config="x").digest() != recipe.digest()


@pytest.mark.parametrize(
    ("image", "variant"),
    [
        ("python:3.13-slim-bookworm", "trixie-python"),  # issue 29: its minor decides, not its Debian
        ("python:3.13", "trixie-python"),
        ("python:3.13-slim", "trixie-python"),
        ("python:3.13-trixie", "trixie-python"),
        ("python:3.13.1-slim", "trixie-python"),
        ("docker.io/library/python:3.13-bookworm", "trixie-python"),
        ("python:3.11-slim", "bookworm-python"),
        ("python:3.11-slim-bookworm", "bookworm-python"),
        ("python:3.11-bullseye", "bookworm-python"),
        ("library/python:3.11.9", "bookworm-python"),
        ("python:3.9.19-slim", "bullseye-python"),  # SkillsBench's lab-unit-harmonization
        ("python:3.9", "bullseye-python"),
        ("python:3.12-slim", "bookworm-python3.12"),  # issue 29: the host's CPython 3.12
        ("python:3.12.9-slim", "bookworm-python3.12"),  # whatever its patch level
        ("python:3.12.8-slim-bookworm", "bookworm-python3.12"),
        ("docker.io/library/python:3.12", "bookworm-python3.12"),
        ("python:3.10-slim", "bookworm-python3.10"),
        ("python:3.10", "bookworm-python3.10"),
        ("python:3.8", None),  # the host's 3.8 is not used
        ("python:3", None),
        ("pythonista:3.13", None),
    ],
)
def test_every_python_3_x_form_is_stood_in_for_by_the_catalogue_image_of_its_minor(
    image: str, variant: str | None, host_pythons: Host
) -> None:
    host_pythons("3.8.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0")
    assert catalogue_variant(image) == variant
    if variant is not None:
        assert python_minor(variant) == ".".join(image.split(":")[1].split("-")[0].split(".")[:2])


@pytest.mark.parametrize(
    ("image", "dockerfile", "target"),
    [
        ("python:3.12-slim", "", "reroll/debian:trixie-python"),  # the nearest minor not older
        ("python:3.14-slim", "", "reroll/debian:trixie-python"),  # else the newest
        ("python:3.10", "", "reroll/debian:bookworm-python"),
        ("python:3.8", "", "reroll/debian:bullseye-python"),
        ("ubuntu:20.04", "RUN pip install numpy==1.26.4\n", "reroll/debian:bookworm-python"),
        ("ubuntu:20.04", "RUN apt-get install -y python3-pip\n", "reroll/debian:bookworm-python"),
        ("example.invalid/x:1", "RUN python3 -m venv /venv\n", "reroll/debian:bookworm-python"),
        ("ubuntu:20.04", "RUN apt-get update && apt-get install -y curl\n", "reroll/base:bookworm"),
        ("alpine:3.19", "", "reroll/base:bookworm"),
    ],
)
def test_the_suggested_target_works_for_the_dockerfile(
    image: str, dockerfile: str, target: str, host_pythons: Host
) -> None:
    """Issue 29: the suggestion was ``reroll/base:bookworm`` (no pip) for every image, also for a
    Dockerfile that runs pip. Here the host has no CPython 3.10 or 3.12."""
    host_pythons()
    assert suggested_target(image, f"FROM {image}\n{dockerfile}") == target
    variant = catalogue_target(target)
    if "pip" in dockerfile or "python" in dockerfile or image.startswith("python:"):
        assert variant is not None and CATALOGUE[variant].python


def test_a_python_base_without_a_catalogue_minor_gets_an_error_naming_one_flag(host_pythons: Host) -> None:
    host_pythons("3.10.13")  # not 3.12
    assert catalogue_variant("python:3.12-slim") is None
    error = unavailable_error(
        ["python:3.12-slim"],
        Path("task/environment/Dockerfile"),
        "FROM python:3.12-slim\nRUN pip install pandas\n",
        "pull access denied for python",
    )
    message = str(error)
    assert "--image-map python:3.12-slim=reroll/debian:trixie-python" in message
    assert "Python 3.12" in message and "3.11" in message and "3.13" in message
    assert "task/environment/Dockerfile" in message and "pull access denied" in message
    assert "reroll/base:bookworm" not in message  # no pip there
    assert "this host has none" in message and "reroll/debian:bookworm-python3.10" in message


def test_a_catalogue_image_named_as_a_target_or_a_from_is_built_on_demand(host_pythons: Host) -> None:
    """Issue 29: ``--image-map python:3.12-slim=reroll/debian:trixie-python`` on a fresh machine
    made Docker pull ``reroll/debian:trixie-python``; now it is built, local or not."""
    host_pythons()
    trixie = catalogue_tag("trixie-python")
    never_local: Callable[[str], bool] = lambda image: False  # noqa: E731
    always_local: Callable[[str], bool] = lambda image: True  # noqa: E731
    assert standins(["reroll/debian:trixie-python"], never_local) == {
        "reroll/debian:trixie-python": "trixie-python"
    }
    assert standins([trixie, "reroll/debian:bookworm"], always_local) == {
        trixie: "trixie-python",
        "reroll/debian:bookworm": "bookworm",
    }
    assert standins(["python:3.13-slim-bookworm", "debian:12"], never_local) == {
        "python:3.13-slim-bookworm": "trixie-python",
        "debian:12": "bookworm",
    }
    assert standins(["python:3.13-slim"], always_local) == {}  # a local image of the public name wins
    assert standins(["python:3.12-slim", "reroll/debian:nonesuch", "reroll/base:bookworm"], never_local) == {}
    assert catalogue_target("reroll/debian:trixie-python-0123456789ab") is None  # not this recipe's hash


def test_a_no_skill_build_drops_the_copies_of_the_skills_folder_alone() -> None:
    kept = "FROM x\nCOPY skills other /b\nCOPY workspace/ /app/\n"
    copies = "COPY skills /root/.claude/skills\nCOPY --chown=1:1 ./skills/ /a\n"
    dockerfile = "FROM x\n" + copies + kept.removeprefix("FROM x\n")
    assert without_copies_of(dockerfile, frozenset({"skills"})) == kept


def test_python_3_12_and_3_10_stand_in_automatically_when_the_host_has_that_cpython(
    host_pythons: Host,
) -> None:
    """Issue 29: ``FROM python:3.12-slim`` needed ``--image-map``; the host's pyenv 3.12 now stands
    in, with no flag (and is what the error suggests); a host without it gets the nearest minor."""
    host_pythons("3.12.1")
    never_local: Callable[[str], bool] = lambda image: False  # noqa: E731
    assert standins(["python:3.12-slim", "python:3.10-slim"], never_local) == {
        "python:3.12-slim": "bookworm-python3.12"
    }
    assert suggested_target("python:3.12-slim") == "reroll/debian:bookworm-python3.12"
    assert suggested_target("python:3.10-slim") == "reroll/debian:bookworm-python"  # 3.11: nearest not older
    assert python_minor("bookworm-python3.12") == "3.12" and python_minor("bookworm-python3.10") is None
    assert buildable_here("bookworm-python3.12") and not buildable_here("bookworm-python3.10")
    host_pythons()  # the host loses its 3.12
    assert standins(["python:3.12-slim"], never_local) == {}
    assert not buildable_here("bookworm-python3.12") and buildable_here("trixie-python")
    assert suggested_target("python:3.12-slim") == "reroll/debian:trixie-python"
    assert (
        catalogue_target("reroll/debian:bookworm-python3.12") == "bookworm-python3.12"
    )  # named: built, or says why


def test_a_host_python_stand_in_is_bookworm_with_its_libraries_and_its_hash_names_the_host_cpython(
    host_pythons: Host,
) -> None:
    assert {f"bookworm-python{minor}" for minor in HOST_PYTHON_MINORS} <= set(CATALOGUE)
    recipe = CATALOGUE["bookworm-python3.12"]
    assert recipe.suite == "bookworm" and recipe.host_python == "3.12" and not recipe.python
    assert {"libssl3", "libffi8", "libsqlite3-0", "ca-certificates"} <= set(recipe.packages)
    without = Recipe(recipe.suite, recipe.packages)
    assert recipe.digest() != without.digest()
    assert catalogue_tag("bookworm-python3.12") != catalogue_tag("bookworm-python3.10")
    host_pythons("3.12.1")
    with_312 = recipe.digest()
    assert "3.12.1/bin/python3.12" in python_standin.identity("3.12")
    host_pythons("3.12.4")  # another build of the host's CPython: another image
    assert recipe.digest() != with_312
    host_pythons()
    assert python_standin.identity("3.12") == "absent" and recipe.digest() != with_312
