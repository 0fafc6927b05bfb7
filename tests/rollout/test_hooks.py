"""The hook protocol (`reroll.rollout.hooks`): the rollout's core imports no feature, every
registered extension loads, and a toy extension registered beside them sees every hook, in
order, on real local rollouts (a recording with checkpoints, then a branch forked from one)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from reroll.jobs.branch import branch
from reroll.rollout import hooks
from reroll.rollout.commands.record import run_task
from reroll.rollout.hooks import EXTENSIONS, Draft, Extension, Run, TurnLaunch, load_extensions
from reroll.rollout.turns.scenes import AgentOutcome
from reroll.rollout.verify.verifiers import Verdict
from reroll.settings import RolloutSettings
from reroll_contracts.errors import ConfigError

from tests.conftest import ROOT
from tests.jobs.test_branch_snapshot import LEDGER, ledger_script, session_agent  # noqa: F401

ROLLOUT = ROOT / "controller" / "reroll" / "rollout"
FEATURES = (
    "reroll.rollout.extensions",
    "reroll.rollout.skills",
    "reroll.rollout.learner_store",
    "reroll.rollout.mcp",
    "reroll.rollout.turns.asks",
    "reroll.rollout.layers",
    "reroll.rollout.verify.judge",
    "reroll.rollout.verify.agent_judge",
    "reroll.rollout.turns.persona",
    "reroll.environment.services",
    "reroll.host.intercept",
    "reroll.runfolder.store",
    "reroll.tasks.skills",
)
"""The extensions' package and the feature modules they wrap."""
HUBS = {"start.py": "start_rollout", "lifecycle.py": "execute_rollout"}
MAX_HUB_LINES = 60
EVENTS_ENV = "REROLL_TEST_HOOK_EVENTS"


def imported(tree: ast.Module) -> set[str]:
    """Every module `tree` imports, at any depth (TYPE_CHECKING blocks included)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


@pytest.mark.parametrize("filename", sorted(HUBS))
def test_the_rollouts_core_imports_no_feature_and_stays_short(filename: str) -> None:
    tree = ast.parse((ROLLOUT / filename).read_text())
    features = sorted(name for name in imported(tree) if name.startswith(FEATURES))
    assert features == [], f"{filename} imports feature modules: {features}"
    function = next(
        node
        for node in tree.body
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == HUBS[filename]
    )
    assert function.end_lineno is not None
    assert function.end_lineno - function.lineno + 1 <= MAX_HUB_LINES


def module_imports(path: Path, package: str) -> set[str]:
    """The modules of `package` that `path` imports at module level, ``if TYPE_CHECKING:`` blocks
    included (a cycle of type-only imports is a cycle too); imports inside functions aside."""
    tree = ast.parse(path.read_text())
    nodes = [*tree.body, *(inner for node in tree.body if isinstance(node, ast.If) for inner in node.body)]
    return {
        node.module
        for node in nodes
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package)
    }


def module_name(path: Path) -> str:
    """The dotted name of the module at `path` (under ``controller/reroll``)."""
    parts = path.relative_to(ROLLOUT.parent).with_suffix("").parts
    return ".".join(("reroll", *parts)).removesuffix(".__init__")


def test_the_rollout_package_has_no_import_cycle() -> None:
    """Module-level imports inside ``reroll.rollout`` form no cycle (type-only ones included)."""
    modules = {
        ".".join(("reroll", *path.relative_to(ROLLOUT.parent).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): path
        for path in ROLLOUT.rglob("*.py")
    }
    graph = {name: module_imports(path, "reroll.rollout") & modules.keys() for name, path in modules.items()}
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for nxt in sorted(graph[name]):
            assert state.get(nxt) != "open", f"import cycle: {' → '.join([*trail, name, nxt])}"
            if nxt not in state:
                visit(nxt, [*trail, name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_every_registered_extension_loads_and_a_broken_entry_is_named() -> None:
    loaded = load_extensions()
    assert len(loaded.extensions) == len(EXTENSIONS)
    assert all(isinstance(extension, Extension) for extension in loaded.extensions)
    with pytest.raises(ConfigError, match=r"rollout extension nope .*reroll\.no_such_module"):
        load_extensions({"nope": "reroll.no_such_module:Nope"})
    with pytest.raises(ConfigError, match=r"is not a reroll\.rollout\.hooks\.Extension"):
        load_extensions({"draft": "reroll.rollout.hooks:Draft"})


class Toy(Extension):
    """Appends each hook it sees to the file named by `EVENTS_ENV`, one line each."""

    def note(self, event: str) -> None:
        with open(os.environ[EVENTS_ENV], "a") as events:
            events.write(f"{event}\n")

    def configure(self, draft: Draft) -> None:
        self.note("configure")

    async def before_sandbox_start(self, run: Run) -> None:
        self.note("before_sandbox_start")

    async def after_sandbox_start(self, run: Run) -> None:
        self.note("after_sandbox_start")

    async def before_agent(self, run: Run) -> None:
        self.note("before_agent")

    async def before_turn(self, run: Run, launch: TurnLaunch) -> None:
        self.note(f"before_turn resume={launch.resume}")

    async def at_checkpoint(self, run: Run, step: int, folder: Path) -> None:
        self.note(f"at_checkpoint {step} {folder.is_dir()}")

    async def at_restore(self, run: Run, step: int, folder: Path) -> None:
        self.note(f"at_restore {step}")

    async def after_agent(self, run: Run, outcome: AgentOutcome) -> None:
        self.note(f"after_agent {outcome.exit_code}")

    async def before_verify(self, run: Run, outcome: AgentOutcome) -> None:
        self.note("before_verify")

    async def after_verify(self, run: Run, verdict: Verdict) -> None:
        self.note(f"after_verify {verdict.rewards}")


@pytest.mark.slow
async def test_a_registered_extension_sees_every_hook_in_order(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    session_agent: str,  # noqa: F811
) -> None:
    """A recording with a checkpoint every 3 steps, then a branch forked from step 3's layers."""
    events = tmp_path / "events.txt"
    monkeypatch.setenv(EVENTS_ENV, str(events))
    monkeypatch.setitem(hooks.EXTENSIONS, "toy", f"{__name__}:Toy")
    recording = await run_task(
        LEDGER,
        agent_name=session_agent,
        model=ledger_script(tmp_path, "original", 6),
        options=RolloutSettings(sandbox="local", checkpoint_every=3),
        jobs_dir=tmp_path / "jobs",
    )
    assert recording.result.status == "ok", recording.result.error
    assert events.read_text().splitlines() == [
        "configure",
        "before_sandbox_start",
        "after_sandbox_start",
        "before_agent",
        "before_turn resume=False",
        "at_checkpoint 3 True",
        "at_checkpoint 6 True",
        "after_agent 0",
        "before_verify",
        "after_verify {'reward': 1.0}",
    ]
    events.unlink()
    child = ledger_script(tmp_path, "child", 3, "child")
    summary = await branch(
        recording.run_dir,
        at=3,
        models=[child],
        options=RolloutSettings(timeout_seconds=120),
        output=tmp_path / "tree",
    )
    assert summary.via == "snapshot" and [c.status for c in summary.children] == ["ok"], summary.children
    assert events.read_text().splitlines() == [
        "configure",  # check_rollout's, before the branch writes anything
        "configure",
        "before_sandbox_start",
        "after_sandbox_start",
        "at_restore 3",
        "before_agent",
        "before_turn resume=True",
        "after_agent 0",
        "before_verify",
        "after_verify {'reward': 1.0}",
    ]
