"""Verifier hardening: undo what an agent may have planted to game the score (seeds/concepts.txt).

Before the agent runs, `take_baseline` records the Python start-up hooks that exist
(``conftest.py``, ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``) and snapshots them with
the workspace's build-config files. Before the test script runs, `harden`:

1. kills every process of the agent's user, then every process group the sidecar started;
2. restores the build-config files and the recorded hooks from that snapshot (files the agent
   created there are deleted, edits are undone);
3. deletes every start-up hook that was not there before (workspace, the agent's HOME, /tmp,
   and in containers the interpreter's site directories);

and `verifier_env` gives the test script a clean environment: a fixed PATH, no PYTHONPATH, no
user site, ``PYTEST_ADDOPTS="-c /dev/null --confcutdir=<verifier dir> -p no:cacheprovider"``
and plugin autoloading off. Each step can be turned off per task (``verifier.hardening``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from reroll.errors import VerifierError
from reroll.sandbox.base import Sandbox
from reroll.tasks import HardeningOptions

BASELINE_SNAPSHOT = "reroll-pre-agent"
BUILD_CONFIG_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "pytest.ini", ".pytest.ini", "tox.ini")
"""Workspace files (top level) restored to their pre-agent state."""
SCAN_TIMEOUT_SECONDS = 120.0

# Runs in the sandbox: prints the sorted list of start-up hook files under the roots given in
# argv[1] (a JSON list, walked recursively) and, when argv[2] is "1", in the site directories.
_SCAN_SCRIPT = r"""
import json, os, site, sys, sysconfig
HOOKS = ("conftest.py", "sitecustomize.py", "usercustomize.py")
def hook(name):
    return name in HOOKS or name.endswith(".pth")
found = set()
for root in json.loads(sys.argv[1]):
    for base, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".git", "node_modules")]
        found.update(os.path.join(base, name) for name in files if hook(name))
if sys.argv[2] == "1":
    dirs = set(site.getsitepackages()) | {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    dirs |= set(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    for folder in dirs:
        if os.path.isdir(folder):
            found.update(os.path.join(folder, n) for n in os.listdir(folder) if hook(n))
print(json.dumps(sorted(found)))
"""


@dataclass(frozen=True)
class Baseline:
    """What existed before the agent ran."""

    hooks: list[str]
    """Start-up hook files (absolute paths in the sandbox)."""
    snapshot_paths: list[str] = field(default_factory=list)
    """What the baseline snapshot holds (build config and hooks); empty when not taken."""


@dataclass(frozen=True)
class HardeningReport:
    """What `harden` did; written to the run folder's ``verifier/hardening.json``."""

    killed_groups: int
    restored: list[str]
    deleted: list[str]


def _scan_roots(sandbox: Sandbox) -> list[str]:
    layout = sandbox.layout
    roots = [layout.workspace, layout.home]
    if layout.agent_user:  # in a container: the agent's scratch space too
        roots += ["/tmp", "/var/tmp", "/dev/shm"]
    return roots


async def _scan(sandbox: Sandbox, env: dict[str, str]) -> list[str]:
    site_dirs = (
        "1" if sandbox.layout.agent_user else "0"
    )  # local: the host's own interpreter, not ours to judge
    result = await sandbox.client.exec(
        ["python3", "-I", "-c", _SCAN_SCRIPT, json.dumps(_scan_roots(sandbox)), site_dirs],
        env=env,
        inherit_env=False,
        timeout_seconds=SCAN_TIMEOUT_SECONDS,
    )
    if result.exit_code != 0:
        raise VerifierError(f"scanning for start-up hooks failed: {result.output_text()[-2000:]}")
    hooks: list[str] = json.loads(result.stdout)
    return hooks


async def take_baseline(sandbox: Sandbox, options: HardeningOptions, env: dict[str, str]) -> Baseline:
    """Record the hooks and snapshot the build config and hooks, before the agent runs.

    Raises:
        VerifierError: the scan failed. SidecarError: the snapshot failed.
    """
    hooks = await _scan(sandbox, env) if options.delete_injected_hooks else []
    paths: list[str] = []
    if options.restore_build_config:
        paths += [f"{sandbox.layout.workspace}/{name}" for name in BUILD_CONFIG_FILES]
    if options.delete_injected_hooks:
        paths += hooks
    if paths:
        await sandbox.snapshot(BASELINE_SNAPSHOT, paths)
    return Baseline(hooks=hooks, snapshot_paths=paths)


async def harden(
    sandbox: Sandbox, options: HardeningOptions, baseline: Baseline | None, env: dict[str, str]
) -> HardeningReport:
    """Kill the agent's processes and undo planted files; see the module docstring.

    Raises:
        VerifierError: the scan failed. SidecarError: the sidecar failed.
    """
    client = sandbox.client
    killed = await client.kill(sandbox.layout.agent_user) if sandbox.layout.agent_user else 0
    killed += await client.kill()
    restored: list[str] = []
    deleted: list[str] = []
    if baseline is not None and baseline.snapshot_paths:
        restored = await sandbox.restore(BASELINE_SNAPSHOT)
    if baseline is not None and options.delete_injected_hooks:
        known = set(baseline.hooks)
        deleted = [path for path in await _scan(sandbox, env) if path not in known]
        if deleted:
            await client.exec(["rm", "-f", "--", *deleted], inherit_env=False, timeout_seconds=60)
    return HardeningReport(killed_groups=killed, restored=restored, deleted=deleted)


def verifier_env(
    sandbox: Sandbox, options: HardeningOptions, env: dict[str, str], verifier_dir: str
) -> dict[str, str]:
    """The test script's environment: `env` (the controller's fixed PATH and layout variables)
    without PYTHONPATH, with pytest locked down as `options` allow."""
    clean = {key: value for key, value in env.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    if sandbox.layout.agent_user:
        clean["HOME"] = "/root"  # not the agent's HOME, whose dotfiles and user site it controls
    clean |= {"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "REROLL_VERIFIER_DIR": verifier_dir}
    if options.pytest_addopts:
        plugins = "".join(f" -p {plugin}" for plugin in options.pytest_plugins)
        clean["PYTEST_ADDOPTS"] = f"-c /dev/null --confcutdir={verifier_dir} -p no:cacheprovider{plugins}"
    if not options.plugin_autoload:
        clean["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return clean
