"""Which pytest plugins the verifier loads: the scan of a real ``python3`` (a venv whose site
directory holds plugin distributions of various owners and modes), the decision between two
scans, and the Verifier end to end in this process (the local sandbox's case: one user)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb
from reroll_sidecar import processes, pytest_plugins, quiesce, verify
from reroll_sidecar.pytest_plugins import Scan
from reroll_sidecar.snapshots import SnapshotStore

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(os.geteuid() != 0, reason="plugins are trusted only when root owns them"),
]
AGENT_UID = 1000
OPTION_PLUGIN = """
def pytest_addoption(parser):
    parser.addoption("--stamp", help="write a file when the session ends")

def pytest_sessionfinish(session):
    path = session.config.getoption("stamp")
    if path:
        open(path, "w").write("stamped\\n")
"""
FORCE_PASS = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def make_venv(root: Path) -> tuple[Path, Path]:
    """A venv of this Python (no pip) under `root`, seeing this interpreter's packages (pytest);
    returns its bin folder and its site directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site,) = root.glob("lib/python3*/site-packages")
    # pytest and its dependencies come from this interpreter's site directory, as a .pth line.
    import _pytest

    (site / "host.pth").write_text(str(Path(_pytest.__file__).parent.parent) + "\n")
    return root / "bin", site


def install(site: Path, dist: str, module: str, source: str, entry_point: str | None = None) -> Path:
    """Write what ``pip install`` writes for a one-module distribution `dist` with a ``pytest11``
    entry point (`entry_point`, default `module`) into `site`; returns its metadata folder."""
    (site / f"{module}.py").write_text(source)
    meta = site / f"{dist}-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (meta / "entry_points.txt").write_text(f"[pytest11]\n{entry_point or module} = {module}\n")
    return meta


def chown_tree(path: Path, uid: int) -> None:
    os.chown(path, uid, uid)
    for entry in path.rglob("*") if path.is_dir() else []:
        os.chown(entry, uid, uid)


async def test_scan_trusts_only_plugins_that_root_alone_can_change(tmp_path: Path) -> None:
    bin_dir, site = make_venv(tmp_path / "venv")
    install(site, "good", "good_plugin", OPTION_PLUGIN)
    chown_tree(install(site, "agent_owned", "agent_plugin", FORCE_PASS), AGENT_UID)
    install(site, "writable", "writable_plugin", FORCE_PASS)
    os.chmod(site / "writable_plugin.py", 0o666)
    install(site, "elsewhere", "elsewhere_plugin", FORCE_PASS, entry_point="elsewhere")
    (site / "elsewhere_plugin.py").unlink()  # its module is not in this site directory
    package = site / "pkg_plugin"
    (package / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text(FORCE_PASS)
    install(site, "pkg", "pkg_plugin", "")
    (site / "pkg_plugin.py").unlink()
    os.chown(package / "__pycache__", AGENT_UID, AGENT_UID)  # the agent could plant a .pyc there

    scan = await pytest_plugins.scan({"PATH": f"{bin_dir}:/usr/bin:/bin"})

    assert str(site) in scan.site_dirs
    # The venv also sees this interpreter's packages (and their plugins) through host.pth.
    assert scan.trusted["good_plugin"] == str(site / "good-1.0.dist-info")
    assert {"agent_plugin", "writable_plugin", "elsewhere", "pkg_plugin"} <= set(scan.untrusted)
    assert {"agent_plugin", "writable_plugin", "elsewhere", "pkg_plugin"}.isdisjoint(scan.trusted)


async def test_scan_refuses_a_site_directory_below_a_folder_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # not sticky: anyone could rename the venv away and put another there
    bin_dir, site = make_venv(shared / "venv")
    install(site, "good", "good_plugin", OPTION_PLUGIN)
    scan = await pytest_plugins.scan({"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert "good_plugin" in scan.untrusted and "good_plugin" not in scan.trusted


async def test_scan_without_python3_finds_nothing(tmp_path: Path) -> None:
    assert await pytest_plugins.scan({"PATH": str(tmp_path)}) == Scan()


async def test_a_failing_python3_loads_only_the_declared_plugins_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "python3").write_text("#!/bin/sh\necho broken >&2\nexit 1\n")
    (tmp_path / "python3").chmod(0o755)
    failed = await pytest_plugins.scan_or_error({"PATH": str(tmp_path)})
    assert failed.error.startswith("python3 failed to scan its site directories: broken")
    decision = pytest_plugins.allowed(["ctrf"], failed, Scan())
    assert decision.names == ["ctrf"]
    assert decision.notes == [
        "pytest plugins loaded (-p): ctrf (declared)",
        f"the image's pytest plugins are not loaded: {failed.error}",
    ]


def test_allowed_keeps_declared_and_twice_trusted_plugins_and_drops_the_rest() -> None:
    before = Scan(
        trusted={"ctrf": "/s/ctrf.dist-info", "moved": "/s/a.dist-info"}, untrusted={"mine": "/h/m"}
    )
    now = Scan(
        trusted={"ctrf": "/s/ctrf.dist-info", "moved": "/s/b.dist-info"},
        untrusted={"mine": "/h/m", "spoof": "/h/spoof.dist-info"},
    )
    decision = pytest_plugins.allowed(["declared", "spoof"], before, now)
    assert decision.names == ["ctrf", "declared"]
    assert decision.notes[0] == "pytest plugins loaded (-p): ctrf (image), declared (declared)"
    assert any("'moved' not loaded: /s/a.dist-info changed" in note for note in decision.notes)
    assert any("'spoof' not loaded: /h/spoof.dist-info is writable" in note for note in decision.notes)
    assert any("'mine' not loaded" in note for note in decision.notes)
    assert pytest_plugins.addopts(decision.names) == " -p ctrf -p declared"
    assert pytest_plugins.addopts(["a b"]) == " -p 'a b'"


TEST_SH = """#!/bin/sh
cd "$(dirname "$0")"
printf 'def test_fails():\\n    assert False\\n' > test_x.py
if python3 -m pytest -q --stamp "$STAMP" test_x.py; then echo 1 > "$LOGS/reward.txt"
else echo 0 > "$LOGS/reward.txt"; fi
"""
HARDENING: dict[str, Any] = {
    "restore_build_config": True,
    "delete_injected_hooks": True,
    "pytest_addopts": True,
    "pytest_report": True,
}


async def verify_after_a_cheat(
    root: Path, monkeypatch: pytest.MonkeyPatch, cheat_owner: int, **hardening: bool
) -> tuple[verify.Baseline, pb.HardeningReport, pb.VerifyResult, str]:
    """PrepareVerify with a venv whose site directory holds the ``--stamp`` plugin, then the
    "agent" installs a plugin forcing every test to pass (owned by `cheat_owner`), then Verify
    runs `TEST_SH` (one failing test). Returns the baseline, the report, the result and the output."""
    monkeypatch.setattr(quiesce, "quiesce", lambda *_, **__: 0)  # no agent process here
    bin_dir, site = make_venv(root / "venv")
    install(site, "stamp", "stamp_plugin", OPTION_PLUGIN)
    for sub in ("app", "home", "verifier", "logs"):
        (root / sub).mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    verifier = verify.Verifier(processes.ProcessGroups(), SnapshotStore(str(root / "state")))
    prepare = pb.PrepareVerifyRequest(
        workspace=str(root / "app"),
        home=str(root / "home"),
        hardening=pb.Hardening(**{**HARDENING, **hardening}),
        env=env,
    )
    baseline = await verifier.prepare(prepare)
    cheat = install(site, "cheat", "cheat_plugin", FORCE_PASS)  # what `pip install` writes
    chown_tree(cheat, cheat_owner)
    os.chown(site / "cheat_plugin.py", cheat_owner, cheat_owner)
    (root / "verifier" / "test.sh").write_text(TEST_SH)
    request = pb.VerifyRequest(
        verifier_dir=str(root / "verifier"),
        script="test.sh",
        reward_dir=str(root / "logs"),
        env={**env, "LOGS": str(root / "logs"), "STAMP": str(root / "stamp.txt")},
        timeout_seconds=60,
    )
    events = [event async for event in verifier.verify(request)]
    output = b"".join(e.stdout + e.stderr for e in events).decode()
    return baseline, events[0].hardening, events[-1].result, output


@pytest.mark.parametrize("owner", [AGENT_UID, 0], ids=["agent", "root"])
async def test_verify_loads_the_image_plugins_and_not_those_installed_after_prepare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner: int
) -> None:
    """A plugin present before PrepareVerify (``--stamp``) loads; a plugin forcing every test to
    pass, installed after it (by the agent's user, or as root: a root agent), does not — the
    failing test scores 0 and the hardening report says why."""
    baseline, report, result, output = await verify_after_a_cheat(tmp_path, monkeypatch, owner)
    assert "stamp_plugin" in baseline.plugins.trusted and "cheat_plugin" not in baseline.plugins.trusted
    assert dict(result.rewards) == {"reward": 0.0}, output
    assert (tmp_path / "stamp.txt").read_text() == "stamped\n", output  # the image plugin's option worked
    loaded = next(note for note in report.notes if note.startswith("pytest plugins loaded (-p): "))
    assert "stamp_plugin (image)" in loaded and "cheat_plugin" not in loaded
    if owner == AGENT_UID:
        assert any(note.startswith("pytest plugin 'cheat_plugin' not loaded") for note in report.notes)


async def test_verify_with_autoload_on_loads_the_cheat_which_shows_it_is_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, result, output = await verify_after_a_cheat(tmp_path, monkeypatch, AGENT_UID, plugin_autoload=True)
    assert dict(result.rewards) == {"reward": 1.0}, output
