"""The sandbox contract (`reroll.conformance`) run against every built-in backend:
`local` (isolated: namespaces and an overlay of the host's root), `local-plain`, and `docker`
on a real Docker engine (slow: its images are built on first use) — on reroll's base image,
and on images the injected sidecar must work in unchanged: one without Python, one with
nothing but a static busybox, and Debian trixie (the catalogue's, also without Python)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from reroll import conformance
from reroll.sandbox.base import SandboxFactory, create_sandbox
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.config import DockerSandboxConfig

pytestmark = pytest.mark.spawns  # every test starts a sandbox (its sidecar, or a container)

BACKENDS = [
    pytest.param("local"),
    pytest.param("local-plain"),
    pytest.param("docker", marks=pytest.mark.slow),
    pytest.param("docker:no-python", marks=pytest.mark.slow),
    pytest.param("docker:busybox", marks=pytest.mark.slow),
    pytest.param("docker:trixie", marks=pytest.mark.slow),
]


@pytest.fixture(params=BACKENDS)
def factory(request: pytest.FixtureRequest) -> SandboxFactory:
    """Makes sandboxes of one built-in backend (``docker:<variant>``: docker on a variant image);
    docker gets its images built once per session first."""
    backend, _, variant = str(request.param).partition(":")
    if backend == "docker":
        request.getfixturevalue("docker_images")
    if variant:
        image = request.getfixturevalue("variant_images")[variant]
        return functools.partial(DockerSandbox, config=DockerSandboxConfig(image=image))
    return functools.partial(create_sandbox, backend)


@pytest.mark.parametrize("check", conformance.CHECKS, ids=conformance.check_name)
async def test_conformance(factory: SandboxFactory, check: conformance.Check, tmp_path: Path) -> None:
    await check(factory, tmp_path)


async def test_self_check_passes_an_out_of_tree_backend_and_names_what_a_broken_one_gets_wrong() -> None:
    """`self_check` as an out-of-tree backend runs it: by class, no pytest fixtures."""
    from tests.sandbox.plugin_backend import ForgetfulSandbox, PluginSandbox

    restore_checks = (
        conformance.snapshots.check_restore_puts_back_contents_modes_symlinks_and_deletions,
        conformance.snapshots.check_snapshot_of_named_paths_records_absent_ones,
    )
    assert await conformance.self_check(PluginSandbox, restore_checks) == {}
    failures = await conformance.self_check(ForgetfulSandbox, restore_checks)
    assert sorted(failures) == sorted(conformance.check_name(check) for check in restore_checks)
    assert "restore differs at" in failures["restore_puts_back_contents_modes_symlinks_and_deletions"]
