"""The catalogue of stand-in base images (`reroll.sandbox.docker.catalogue`): which public base
each stands in for, and its tags. No Docker needed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from reroll.sandbox.docker.catalogue import (
    CATALOGUE,
    PUBLIC_BASES,
    Recipe,
    catalogue_tag,
    catalogue_target,
    catalogue_variant,
    python_minor,
    standins,
    suggested_target,
    unavailable_error,
    without_copies_of,
)


def test_catalogue_variant_knows_public_bases_under_every_spelling() -> None:
    assert catalogue_variant("python:3.13-slim") == "trixie-python"
    assert catalogue_variant("docker.io/library/debian:bookworm-slim") == "bookworm"
    assert catalogue_variant("library/debian:13") == "trixie"
    assert catalogue_variant("python:3.12-slim") is None  # no equal here: the user maps it
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
        ("python:3.12-slim", None),
        ("python:3.10", None),
        ("python:3", None),
        ("pythonista:3.13", None),
    ],
)
def test_every_python_3_x_form_is_stood_in_for_by_the_catalogue_image_of_its_minor(
    image: str, variant: str | None
) -> None:
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
def test_the_suggested_target_works_for_the_dockerfile(image: str, dockerfile: str, target: str) -> None:
    """Issue 29: the suggestion was ``reroll/base:bookworm`` (no pip) for every image, also for a
    Dockerfile that runs pip."""
    assert suggested_target(image, f"FROM {image}\n{dockerfile}") == target
    variant = catalogue_target(target)
    if "pip" in dockerfile or "python" in dockerfile or image.startswith("python:"):
        assert variant is not None and CATALOGUE[variant].python


def test_a_python_base_without_a_catalogue_minor_gets_an_error_naming_one_flag() -> None:
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


def test_a_catalogue_image_named_as_a_target_or_a_from_is_built_on_demand() -> None:
    """Issue 29: ``--image-map python:3.12-slim=reroll/debian:trixie-python`` on a fresh machine
    made Docker pull ``reroll/debian:trixie-python``; now it is built, local or not."""
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
