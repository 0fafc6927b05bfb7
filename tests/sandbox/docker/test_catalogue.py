"""The catalogue of stand-in base images (`reroll.sandbox.docker.catalogue`): which public base
each stands in for, and its tags. No Docker needed."""

from __future__ import annotations

from reroll.sandbox.docker.catalogue import (
    CATALOGUE,
    PUBLIC_BASES,
    Recipe,
    catalogue_tag,
    catalogue_variant,
)


def test_catalogue_variant_knows_public_bases_under_every_spelling() -> None:
    assert catalogue_variant("python:3.13-slim") == "trixie-python"
    assert catalogue_variant("docker.io/library/debian:bookworm-slim") == "bookworm"
    assert catalogue_variant("library/debian:13") == "trixie"
    assert catalogue_variant("python:3.12-slim") is None  # no equal here: the user maps it
    assert catalogue_variant("ubuntu:20.04") is None
    assert set(PUBLIC_BASES.values()) == set(CATALOGUE)


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
