"""The soft verify's fence (`reroll_sidecar.fence`) against a verifier payload, with real find,
tar and processes.

Each scenario runs in a child Python process that makes itself a child subreaper, as the sidecar
does (so a double-forked daemon stays its descendant), enters the fence, plays the payload —
copies of the hidden tests into the agent's folders and elsewhere, a daemon, changed modes — then
leaves the fence and reports what is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reroll_sidecar import fence

SCENARIO = r"""
import asyncio, json, os, shutil, subprocess, sys
from reroll_sidecar import fence, quiesce
from reroll_sidecar.snapshots import SnapshotStore

root, payload = sys.argv[1], sys.argv[2]
assert quiesce.become_subreaper()
areas = [f"{root}/work", f"{root}/home", f"{root}/scratch"]


async def main():
    fenced = fence.Fence(
        SnapshotStore(f"{root}/rest/state"), areas, discard=[f"{root}/rest/verifier"], rest=[f"{root}/rest"]
    )
    await fenced.enter()
    subprocess.run(["sh", "-c", payload, "payload", root], check=True)
    left = await fenced.leave()
    print(json.dumps({"deleted": left.deleted, "repaired": left.repaired, "killed": left.killed,
                      "unrecoverable": left.unrecoverable, "error": left.error()}))


asyncio.run(main())
"""

COPY_EVERYWHERE = r"""
root=$1
cp "$root/rest/verifier/test_hidden.py" "$root/home/stolen.py"
cp -r "$root/rest/verifier" "$root/scratch/verifier-copy"
cp "$root/rest/verifier/test_hidden.py" "$root/work/.hidden"
echo 'def mean(v): return 2' > "$root/work/calc.py"
mkdir -p "$root/rest/lib/new/deep" && cp "$root/rest/verifier/test_hidden.py" "$root/rest/lib/new/deep/"
cp "$root/rest/verifier/test_hidden.py" "$root/rest/state/leak"
chmod 777 "$root/rest/lib"
# a daemon that would hand the tests over later: double fork, new session
setsid sh -c 'sleep 300 & echo $! > "$1/daemon.pid"' daemon "$root/work/../" &
wait
sleep 0.2
cp "$root/daemon.pid" "$root/rest/daemon.pid.copy" 2>/dev/null || true
"""


def make_sandbox(root: Path) -> None:
    """The agent's folders, a 'rest' (system files, the sidecar's state) and the verifier folder."""
    for folder in ("work", "home", "scratch", "rest/lib", "rest/state", "rest/verifier"):
        (root / folder).mkdir(parents=True)
    (root / "work" / "calc.py").write_text("def mean(v): return sum(v) / len(v)\n")
    (root / "home" / ".profile").write_text("# the agent's\n")
    (root / "rest" / "lib" / "os.py").write_text("# a system module\n")
    (root / "rest" / "lib" / "other.py").write_text("# another\n")
    (root / "rest" / "verifier" / "test_hidden.py").write_text("SECRET = 'the hidden tests'\n")
    (root / "rest" / "lib").chmod(0o755)


def run_scenario(root: Path, payload: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(root), payload], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return report


def readable_copies(root: Path) -> list[str]:
    """Every file under `root` holding the hidden tests' secret."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if "the hidden tests" in path.read_text(errors="replace"):
                found.append(str(path))
    return found


@pytest.mark.spawns
def test_the_fence_leaves_no_copy_no_daemon_and_the_agents_work_as_it_was(tmp_path: Path) -> None:
    make_sandbox(tmp_path)
    report = run_scenario(tmp_path, COPY_EVERYWHERE)
    assert report["unrecoverable"] == [] and report["error"] == ""
    assert readable_copies(tmp_path) == []  # the verifier folder itself is discarded too
    assert (tmp_path / "work" / "calc.py").read_text() == "def mean(v): return sum(v) / len(v)\n"
    assert (tmp_path / "home" / ".profile").read_text() == "# the agent's\n"
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == [".profile"]
    assert not (tmp_path / "rest" / "lib" / "new").exists()
    assert not (tmp_path / "rest" / "state" / "leak").exists()
    assert (tmp_path / "rest" / "lib").stat().st_mode & 0o777 == 0o755
    assert report["repaired"] == [str(tmp_path / "rest" / "lib")]
    daemon = int((tmp_path / "daemon.pid").read_text())
    assert not Path(f"/proc/{daemon}").exists() or "Z" in Path(f"/proc/{daemon}/stat").read_text().split()[2]
    assert isinstance(report["killed"], int) and report["killed"] >= 1


@pytest.mark.spawns
def test_a_system_file_changed_in_place_or_deleted_is_reported_not_hidden(tmp_path: Path) -> None:
    make_sandbox(tmp_path)
    payload = 'cat "$1/rest/verifier/test_hidden.py" >> "$1/rest/lib/os.py"; rm "$1/rest/lib/other.py"'
    report = run_scenario(tmp_path, payload)
    lib = tmp_path / "rest" / "lib"
    assert report["unrecoverable"] == [f"{lib}/os.py (changed)", f"{lib}/other.py (deleted)"]
    assert "cannot be put back" in str(report["error"]) and "trial cannot go on" in str(report["error"])


@pytest.mark.spawns
def test_a_tampered_snapshot_of_the_agents_folders_is_never_restored(tmp_path: Path) -> None:
    """The payload runs as the sidecar's user: it could rewrite the snapshot so that the restore
    plants the tests in the workspace. The snapshot is part of the walked rest, so that is seen."""
    make_sandbox(tmp_path)
    snapshot = '"$1"/rest/state/snapshots/reroll-soft-verify'
    payload = f'for f in {snapshot}/*; do [ -f "$f" ] && echo x >> "$f"; done'
    report = run_scenario(tmp_path, payload)
    unrecoverable = report["unrecoverable"]
    assert isinstance(unrecoverable, list)
    assert any("reroll-soft-verify" in entry and "(changed)" in entry for entry in unrecoverable)


def test_split_areas_keeps_the_snapshots_folder_out_and_drops_nested_areas(tmp_path: Path) -> None:
    (tmp_path / "tmp" / "sandbox" / "state").mkdir(parents=True)
    (tmp_path / "tmp" / "other").mkdir()
    (tmp_path / "tmp" / "sandbox" / "app").mkdir()
    (tmp_path / "home").mkdir()
    areas = [str(tmp_path / "tmp"), str(tmp_path / "home"), str(tmp_path / "home" / "x")]
    assert fence.split_areas(areas, str(tmp_path / "tmp" / "sandbox" / "state")) == [
        str(tmp_path / "home"),
        str(tmp_path / "tmp" / "other"),
        str(tmp_path / "tmp" / "sandbox" / "app"),
    ]


def test_writable_mounts_and_the_hosts_overlay_from_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "1 0 0:1 / / rw,nosuid - overlay overlay rw,lowerdir=/,upperdir=/s/u,workdir=/s/w\n"
        "2 1 0:2 / /proc rw - proc proc rw\n"
        "3 1 0:3 / /usr ro,nosuid - ext4 /dev/vda ro\n"
        "4 1 0:4 / /my\\040app rw - tmpfs tmpfs rw\n"
        "5 1 0:5 / /dev/pts rw - devpts devpts rw\n"
    )
    assert fence.writable_mounts(str(info)) == ["/", "/my app"]
    assert fence.read_only_mounts(str(info)) == ["/usr"]
    assert fence.host_overlay_root(str(info))
    info.write_text("1 0 0:1 / / rw - overlay overlay rw,lowerdir=/var/lib/docker/l/A:/var/lib/docker/l/B\n")
    assert not fence.host_overlay_root(str(info))
