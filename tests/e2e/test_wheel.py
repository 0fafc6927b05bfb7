"""The built distribution works without the source tree: the wheel carries every module and data
file, and a rollout runs from a fresh virtualenv with only that wheel installed.

`uv build` makes the sdist and then the wheel from it (so the sdist is complete too), once per
session; the virtualenv gets the wheel with the versions of uv.lock (uv's cache makes that a few
seconds); `reroll run` then runs from a folder outside the checkout, with the `local` and the
`docker` backend (the docker images are built once by the shared `docker_images` fixture, and the
wheel's copy of the sidecar hashes to the same image tags).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT, UV

PACKAGE_FOLDERS = {
    "reroll": ROOT / "controller" / "reroll",
    "reroll_contracts": ROOT / "contracts" / "reroll_contracts",
    "reroll_sidecar": ROOT / "sidecar" / "reroll_sidecar",
    "reroll_proxy": ROOT / "proxy" / "reroll_proxy",
    "reroll_protos": ROOT / "protos" / "reroll_protos",
}
pytestmark = pytest.mark.slow


def run(argv: list[str], cwd: Path) -> str:
    """Run a command; fail the test with its output unless it exits 0. Returns its stdout."""
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=900)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bin/`` of a fresh virtualenv under ``/tmp`` (outside the checkout) holding the wheel and
    its locked dependencies: the sandbox is built from what the rollout needs (its sidecar from
    its own bundle), so a controller installed anywhere works, ``/tmp`` included."""
    return _install(tmp_path_factory.mktemp("test-wheel"), wheel)


def _install(work: Path, wheel: Path) -> Path:
    """Make the virtualenv in `work` and install `wheel` into it; returns its ``bin/``."""
    constraints = work / "constraints.txt"
    export = [UV, "export", "--quiet", "--frozen", "--no-hashes", "--no-emit-project"]
    run([*export, "--project", str(ROOT), "--output-file", str(constraints)], cwd=work)
    venv = work / "venv"
    # --seed: pip, as in any user's venv (the docker backend downloads the sidecar's wheels with it).
    run([UV, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)], cwd=work)
    install = [UV, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)]
    run([*install, "--constraint", str(constraints)], cwd=work)
    return venv / "bin"


def test_the_wheel_carries_every_file_of_the_five_packages(wheel: Path) -> None:
    """Modules of every subpackage (formats/, intercept/ were once missing) and the data files the
    runtime reads (agents.yaml, images/, the protos)."""
    in_tree = {  # controller/reroll/images is a link to the top-level images/: followed
        f"{package}/{(Path(top) / name).relative_to(folder).as_posix()}"
        for package, folder in PACKAGE_FOLDERS.items()
        for top, _, names in os.walk(folder, followlinks=True)
        for name in names
        if "__pycache__" not in Path(top).parts
    }
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name for name in archive.namelist() if ".dist-info/" not in name}
    assert in_wheel == in_tree, f"only in the wheel: {in_wheel - in_tree}; missing: {in_tree - in_wheel}"
    assert {"reroll_contracts/wire/openai_chat.py", "reroll/images/sidecar/reroll-sidecar.spec"} <= in_wheel


def test_a_rollout_runs_from_the_installed_wheel(
    installed: Path, sandbox_backend: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`reroll run` with the oracle agent, from a folder outside the checkout: reward 1.0."""
    outside = tmp_path_factory.mktemp(f"wheel-run-{sandbox_backend}")
    imported = run([str(installed / "python"), "-c", "import reroll; print(reroll.__file__)"], cwd=outside)
    assert Path(imported.strip()).is_relative_to(installed.parent), imported
    task = EXAMPLES / "fix-failing-test"
    argv = [str(installed / "reroll"), "run", str(task), "--agent", "oracle", "--sandbox", sandbox_backend]
    run([*argv, "--jobs-dir", "jobs", "--job-name", "wheel"], cwd=outside)
    (folder,) = (outside / "jobs" / "wheel").iterdir()
    result = json.loads((folder / "result.json").read_text())
    assert result["status"] == "ok", result
    assert result["rewards"]["reward"] == 1.0, result
