"""`reroll.runfolder.paths`: the paths it gives are the run folder's format, it touches no file but
``harness/``, and no controller module outside ``runfolder/`` builds a run-folder path by hand.

The check is read from the sources (no import of the modules checked), like
``tests/contracts/test_layers.py``: a module outside ``runfolder/`` may not join with ``/``

- a name of the run-folder tree declared in ``runfolder/`` (``run_dir / CONFIG_FILE``,
  ``CONTROLLER_LOG.name``), or such a name as a string literal (``run_dir / "harness"``);
- anything to a folder variable of the tree (``run_dir / x``, ``job_dir / x``, ``output_dir / x``);
- anything to ``harness_folder(...)`` or ``harness_part(...)``, nor call them (`RunPaths` does);

and may not declare again, as a constant of its own, a file or folder name of the tree.
"""

from __future__ import annotations

import ast
import stat
from pathlib import Path, PurePath

import pytest
from reroll.runfolder import asks, folders, paths, run, store, summary, trial
from reroll.runfolder.paths import (
    POOL_FILE,
    CheckpointPaths,
    JobPaths,
    RunPaths,
    VerifierPaths,
    proxy_config_in,
)
from reroll.runfolder.run import load_run_folder, write_json

from tests.export.conftest import chat_exchanges, write_run

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER = ROOT / "controller" / "reroll"
RUNFOLDER = CONTROLLER / "runfolder"
FOLDER_VARIABLES = {"run_dir", "run_folder", "job_dir", "output_dir", "summary_dir"}
"""Variables (or attributes) that hold a folder of the run-folder tree: nothing is joined to them
outside ``runfolder/``."""
HARNESS_HELPERS = {"harness_folder", "harness_part"}
GENERIC_NAMES = {
    "agent",
    "verifier",
    "services",
    "trajectory",
    "judge",
    "store",
    "skills",
    "memory",
    "objects",
}
"""Names of the tree that are also ordinary words of other layouts (a role ``agent``, a task's
``verifier/``, an environment's ``services``): declaring a constant with one of these values is no
duplicate of the run folder's; joining one with ``/`` still is, unless `ALLOWED` says why not."""
ALLOWED: dict[tuple[str, str], str] = {
    (
        "conformance/support.py",
        "'verifier'",
    ): "the probe task's folder (task.md's verifier/), not a run folder",
    ("tasks/task.py", "'verifier'"): "a task folder's verifier/, not a run folder",
    ("sandbox/local/isolated.py", "'verifier'"): "the isolated sandbox's own root folder, not a run folder",
}
"""(module below controller/reroll, what it joins) → why that join is not a run-folder path."""


def _tree_names() -> dict[str, str]:
    """The file and folder names of the tree declared in ``runfolder/``: module-level constants of
    its modules whose value is a name (a str or a relative Path without spaces), by constant name."""
    names: dict[str, str] = {}
    for module in (asks, folders, paths, run, store, summary, trial):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        declared = [
            target.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name) and target.id.isupper()
        ]
        for name in declared:
            value = getattr(module, name)
            values = value if isinstance(value, tuple) else (value,)
            for item in values:
                if (
                    isinstance(item, (str, PurePath))
                    and str(item)
                    and not any(c.isspace() for c in str(item))
                ):
                    names[name if len(values) == 1 else f"{name}[{values.index(item)}]"] = str(item)
    return names


TREE_NAMES = _tree_names()
TREE_VALUES = {value for value in TREE_NAMES.values()} | {
    part for value in TREE_NAMES.values() for part in PurePath(value).parts
}


def _operands(node: ast.expr) -> list[ast.expr]:
    """The operands of a chain of ``/`` (``a / b / c`` → a, b, c)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _operands(node.left) + _operands(node.right)
    return [node]


def _named(node: ast.expr) -> str | None:
    """The identifier a Name is, or an Attribute ends with."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _from_runfolder(tree: ast.Module) -> set[str]:
    """The names `tree` imports from ``reroll.runfolder…``."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reroll.runfolder")
        for alias in node.names
    }


def _join_offence(operand: ast.expr, imported: set[str], first: bool) -> str | None:
    """What is hand-built about `operand` of a ``/`` chain (`first`: its leftmost), or None."""
    if first and _named(operand) in FOLDER_VARIABLES:
        return f"joins to {ast.unparse(operand)}"
    if isinstance(operand, ast.Attribute) and isinstance(operand.value, ast.Name):
        operand = operand.value  # CONTROLLER_LOG.name
    if isinstance(operand, ast.Name) and operand.id in imported and operand.id in TREE_NAMES:
        return f"joins {operand.id}"
    if isinstance(operand, ast.Constant) and isinstance(operand.value, str) and operand.value in TREE_VALUES:
        return f"joins {operand.value!r}"
    if isinstance(operand, ast.Call) and _named(operand.func) in HARNESS_HELPERS:
        return f"joins to {_named(operand.func)}()"
    return None


def hand_built(source: str) -> list[str]:
    """Where `source` (a module outside ``runfolder/``) builds a run-folder path by hand, each as
    ``line: what``; see the module docstring for the rules."""
    tree = ast.parse(source)
    imported = _from_runfolder(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for index, operand in enumerate(_operands(node)):
                offence = _join_offence(operand, imported, index == 0)
                if offence is not None:
                    found.append(f"{node.lineno}: {offence}")
        elif isinstance(node, ast.Call) and _named(node.func) in HARNESS_HELPERS & imported:
            found.append(f"{node.lineno}: calls {_named(node.func)}")
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        name = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
        if name in TREE_VALUES and name not in GENERIC_NAMES:
            found.append(f"{node.lineno}: declares {name!r} again")
    return sorted(set(found), key=lambda entry: int(entry.split(":")[0]))


def hand_built_modules(controller: Path) -> dict[str, list[str]]:
    """`hand_built` of every module below `controller` outside ``runfolder/``, by its path below
    `controller`, those with none left out; the joins `ALLOWED` says are no run-folder paths too."""
    offenders: dict[str, list[str]] = {}
    for file in sorted(controller.rglob("*.py")):
        module = file.relative_to(controller).as_posix()
        if module.startswith("runfolder/"):
            continue
        found = [
            entry
            for entry in hand_built(file.read_text())
            if (module, entry.split(": joins ", 1)[-1]) not in ALLOWED
        ]
        if found:
            offenders[module] = found
    return offenders


def test_no_module_outside_runfolder_builds_a_run_folder_path_by_hand() -> None:
    assert hand_built_modules(CONTROLLER) == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from reroll.runfolder.run import CONFIG_FILE\nf = run_dir / CONFIG_FILE", "2: joins to run_dir"),
        ("from reroll.runfolder.run import CONFIG_FILE\nf = folder / CONFIG_FILE", "2: joins CONFIG_FILE"),
        (
            "from reroll.runfolder.run import CONTROLLER_LOG\nf = d / CONTROLLER_LOG.name",
            "2: joins CONTROLLER_LOG",
        ),
        ("f = plan.run_dir / 'x'", "1: joins to plan.run_dir"),
        ("f = request.output_dir / name", "1: joins to request.output_dir"),
        ("f = folder / 'harness' / 'proxy.json'", "1: joins 'harness'"),
        ("f = original.path.parent / 'rescored'", "1: joins 'rescored'"),
        ("from reroll.runfolder.run import harness_folder\nf = harness_folder(d)", "2: calls harness_folder"),
        ("JUDGE_FILE = 'judge.json'", "1: declares 'judge.json' again"),
        ("DETAILS = 'reward-details.json'", "1: declares 'reward-details.json' again"),
    ],
)
def test_the_check_finds_each_kind_of_hand_built_path(source: str, expected: str) -> None:
    assert expected in hand_built(source)


@pytest.mark.parametrize(
    "source",
    [
        "ROLE = 'agent'",  # a generic word, declared for another meaning
        "f = task.path / 'environment' / 'Dockerfile'",
        "from reroll.runfolder.paths import RunPaths\nf = RunPaths(run_dir).config",
        "message = f'{run_dir}: no {CONFIG_FILE}'",
    ],
)
def test_the_check_lets_other_paths_and_asked_paths_be(source: str) -> None:
    assert hand_built(source) == []


def test_every_allowed_join_is_still_there() -> None:
    for (module, joined), why in ALLOWED.items():
        found = [entry.split(": joins ", 1)[-1] for entry in hand_built((CONTROLLER / module).read_text())]
        assert joined in found, f"{module}: no longer joins {joined} ({why}): drop it from ALLOWED"


def test_the_run_paths_are_the_run_folder_format(tmp_path: Path) -> None:
    at = RunPaths(tmp_path)
    expected = {
        at.config: "config.json",
        at.result: "result.json",
        at.prompts: "prompts.json",
        at.trial: "trial.json",
        at.trajectory: "trajectory/llm_trajectory.jsonl",
        at.judge_trajectory: "trajectory/judge_trajectory.jsonl",
        at.user_trajectory: "trajectory/user_trajectory.jsonl",
        at.side_trajectory("user"): "trajectory/user_trajectory.jsonl",
        at.asks: "asks.json",
        at.verifier.root: "verifier",
        at.verifier.judge: "verifier/judge.json",
        at.verifier.agent_judge: "verifier/agent_judge.json",
        at.verifier.details: "verifier/reward-details.json",
        at.verifier.state_query: "verifier/environment_state.txt",
        at.verifier.reward_json: "verifier/reward.json",
        at.verifier.judge_run: "verifier/judge",
        at.verifier.round(2).stdout: "verifier/rounds/2/test-stdout.txt",
        at.agent_log: "agent/output.log",
        at.manifest: "workspace_manifest.json",
        at.error: "error.txt",
        at.limits: "limits.txt",
        at.fidelity: "fidelity.json",
        at.service_log("db"): "services/db.log",
        at.services_record: "services/services.json",
        at.setup_log: "services/setup.log",
        at.controller_log: "harness/controller.log",
        at.proxy_config: "harness/proxy.json",
        at.restored_checkpoint: "harness/restored-checkpoint.json",
        at.checkpoint_holds: "harness/checkpoint-holds.json",
        at.replayed_remainder: "harness/replayed-remainder.jsonl",
        at.checkpoint(3).record: "checkpoints/step-3/checkpoint.json",
        at.checkpoint(3).pool: "checkpoints/step-3/pool.json",
        at.checkpoint(3).layer("session.tar"): "checkpoints/step-3/session.tar",
        at.tree_summary: "summary.json",
        at.file(PurePath("verifier/out.json")): "verifier/out.json",
    }
    assert {path.relative_to(tmp_path).as_posix(): name for path, name in expected.items()} == {
        name: name for name in expected.values()
    }
    assert at.beside("rescored") == tmp_path.parent / "rescored"
    assert at.beside("continued") == tmp_path.parent / "continued"
    assert list(tmp_path.iterdir()) == []  # asking touched nothing


def test_the_job_paths_are_the_job_folder_format(tmp_path: Path) -> None:
    job = JobPaths(tmp_path)
    assert [
        job.spec,
        job.summary,
        job.attempts,
        job.store,
        job.continued.summary,
        job.run("a__1").config,
    ] == [
        tmp_path / "job.json",
        tmp_path / "summary.json",
        tmp_path / "_attempts",
        tmp_path / "store",
        tmp_path / "continued" / "summary.json",
        tmp_path / "a__1" / "config.json",
    ]


def test_only_the_harness_is_made_and_only_the_owner_may_enter_it(tmp_path: Path) -> None:
    at = RunPaths(tmp_path / "run")
    (tmp_path / "run").mkdir()
    assert not at.harness.exists()
    assert at.harness_part("judge") == tmp_path / "run" / "harness" / "judge"
    assert stat.S_IMODE(at.harness.stat().st_mode) == 0o700
    assert not (at.harness / "judge").exists()
    assert at.make_harness() == at.harness
    assert proxy_config_in(at.harness) == at.proxy_config


def test_the_checkpoint_steps_are_those_on_disk_in_order(tmp_path: Path) -> None:
    at = RunPaths(tmp_path)
    assert at.checkpoint_steps() == []
    for step in (10, 2, 7):
        at.checkpoint(step).root.mkdir(parents=True)
    (at.checkpoints / "step-x").mkdir()
    (at.checkpoints / "notes").mkdir()
    assert at.checkpoint_steps() == [2, 7, 10]
    assert CheckpointPaths(at.checkpoint(2).root).pool.name == POOL_FILE


def test_the_verifier_finds_the_reward_file_it_wrote(tmp_path: Path) -> None:
    out = VerifierPaths(tmp_path)
    assert out.found_reward() is None
    out.reward("reward.json").write_text("{}")
    assert out.found_reward() == tmp_path / "reward.json"
    out.reward("reward.txt").write_text("1\n")
    assert out.found_reward() == tmp_path / "reward.txt"  # reward.txt comes first


def test_a_run_folder_written_through_run_paths_loads(tmp_path: Path) -> None:
    write_run(tmp_path / "r", chat_exchanges()[:1])
    at = RunPaths(tmp_path / "r")
    write_json(at.prompts, ["again"])
    loaded = load_run_folder(at.root)
    assert loaded.prompts == ["again"] and len(loaded.exchanges) == 1
