"""The sidecar bundle's Python sources, staged as `sidecar_bundle` stages them (no Docker needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox import sidecar_bundle
from reroll.sandbox.sidecar_bundle import sidecar_lib


@pytest.mark.spawns
def test_the_sidecar_lib_runs_the_sidecar_on_its_own(tmp_path: Path) -> None:
    """Only the files the bundle is frozen from: the sidecar finds the exception tree among them
    (``reroll_contracts``, a normal package), and nothing of the controller (``reroll``)."""
    lib = tmp_path / "lib"
    for relative, content in sidecar_lib():
        (lib / relative).parent.mkdir(parents=True, exist_ok=True)
        (lib / relative).write_bytes(content)
    assert sorted(p.name for p in lib.iterdir()) == ["reroll_contracts", "reroll_protos", "reroll_sidecar"]
    probe = "import reroll_contracts.errors, reroll_sidecar.server; print(reroll_contracts.errors.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(lib)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(lib / "reroll_contracts" / "errors.py")


@pytest.mark.slow
@pytest.mark.spawns
async def test_the_bundle_leaves_nothing_of_itself_in_the_environment_of_the_commands_it_runs(
    variant_images: dict[str, str], tmp_path: Path
) -> None:
    """On the busybox-only image: commands see neither PyInstaller's variables nor its library
    path (they would load the bundle's libraries), and the bundle's own GNU find runs there."""
    from reroll.conformance import probe_task
    from reroll.sandbox.docker.backend import DockerSandbox
    from reroll.sandbox.docker.config import DockerSandboxConfig
    from reroll.sandbox.sidecar_bundle import MOUNT_DIR

    config = DockerSandboxConfig(image=variant_images["busybox"])
    async with DockerSandbox(sandbox_spec(probe_task(tmp_path / "task")), "bundle-env", config) as sandbox:
        env = await sandbox.exec(["env"], inherit_env=True)
        assert env.exit_code == 0, env.output_text()
        names = {line.split("=", 1)[0] for line in env.stdout.decode().splitlines()}
        assert not {name for name in names if name.startswith(("_PYI_", "LD_"))}, names
        find = await sandbox.exec([f"{MOUNT_DIR}/_internal/tools/find", "--version"])
        assert find.exit_code == 0 and b"GNU findutils" in find.stdout, find.output_text()


def test_the_bundle_key_is_computed_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sandbox's start asks for the bundle: its sources are hashed and the tools run once."""

    found: list[int] = []

    def tool_paths() -> list[Path]:
        found.append(1)
        return []

    monkeypatch.setattr(sidecar_bundle, "_tool_paths", tool_paths)
    sidecar_bundle.bundle_key.cache_clear()
    try:
        assert sidecar_bundle.bundle_key() == sidecar_bundle.bundle_key()
        assert found == [1]
    finally:
        sidecar_bundle.bundle_key.cache_clear()  # the next caller's key has the real tools
