"""``reroll task check`` agrees with BenchFlow's own ``check_task`` (structural level) on which
bundled tasks load: every task folder under ``examples/tasks/`` and ``tests/fixtures/``, and
variants of the BenchFlow-format fixtures that each break one strategy field.

BenchFlow runs in a throwaway virtualenv of its own: ``benchflow==0.7.11`` from PyPI (`BENCHFLOW`),
which needs Python 3.12 or later (PyPI offers a 3.11 interpreter only benchflow 0.1.x), so the
virtualenv is made with the first CPython >= 3.12 found (`newer_python`: pyenv's, or on ``PATH``);
without one the test is skipped. BenchFlow is installed without its dependencies, and only the
light ones ``benchflow._utils.task_authoring`` imports are added (`BENCHFLOW_DEPENDENCIES`; litellm,
Google's and the agent SDKs are not needed).

Known disagreements (`KNOWN`) are listed with why; any other fails the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError

from tests.conftest import UV

pytestmark = [pytest.mark.slow, pytest.mark.spawns]

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
BENCHFLOW = "benchflow==0.7.11"
"""The BenchFlow release issue 30 names, the one reroll's task format follows."""
BENCHFLOW_DEPENDENCIES = [
    "pydantic",
    "pyyaml",
    "httpx",
    "rich",
    "packaging",
    "anyio",
    "agent-client-protocol",
    "tomli-w",
]
KNOWN = {
    "mail-calendar-compose": "a Harbor task whose environment is only docker-compose.yaml: "
    "BenchFlow's structural check requires environment/Dockerfile",
    "kit-criteria-bad-method": "BenchFlow checks the criteria only at publication grade and when "
    "the verifier runs (after the agent); reroll refuses the task at load",
    "ors-dotdot": "BenchFlow refuses an input with '..' only when the verifier runs (after the "
    "agent); reroll refuses the task at load",
}
CHECK = """
import json, sys
from pathlib import Path
from benchflow._utils.task_authoring import check_task
print(json.dumps({p: check_task(Path(p)) for p in sys.argv[1:]}))
"""
VARIANTS = {  # name: (fixture, text of its verifier.md, replacement)
    "kit-no-root": ("benchflow-reward-kit", "      root: rewards\n", ""),
    "kit-abs-root": ("benchflow-reward-kit", "root: rewards", "root: /rewards"),
    "kit-entry-missing": ("benchflow-reward-kit", "root: rewards", "root: rewards\n      entrypoint: run.py"),
    "kit-criteria-missing": ("benchflow-reward-kit", "rewards/criteria.toml", "rewards/none.toml"),
    "kit-criteria-bad-method": ("benchflow-reward-kit", "", ""),  # its criteria file replaced below
    "kit-no-criteria": ("benchflow-reward-kit", "      criteria: rewards/criteria.toml\n", ""),
    "ors-no-inputs": ("benchflow-ors-episode", "      inputs: [/logs/agent/episode.jsonl]\n", ""),
    "ors-format-xml": ("benchflow-ors-episode", "format: jsonl", "format: xml"),
    "ors-dotdot": ("benchflow-ors-episode", "/logs/agent/episode.jsonl", "../episode.jsonl"),
    "script-no-command": (
        "benchflow-script-strategy",
        "      command: python3 grade.py --expected expected.txt\n",
        "",
    ),
    "script-no-type": ("benchflow-script-strategy", "      type: script\n", ""),
    "script-test-sh-missing": (
        "benchflow-script-strategy",
        "python3 grade.py --expected expected.txt",
        "./test.sh",
    ),
    "unknown-type": ("benchflow-script-strategy", "type: script", "type: magic"),
    "judge-no-role": ("benchflow-agent-judge", "      role: reviewer\n", ""),
    "judge-role-unsectioned": ("benchflow-agent-judge", "role: reviewer", "role: critic"),
    "judge-no-isolation": ("benchflow-agent-judge", "      isolation: verifier-only\n", ""),
    "judge-shared": ("benchflow-agent-judge", "isolation: verifier-only", "isolation: shared"),
    "judge-no-inputs": ("benchflow-agent-judge", "      inputs: [/app/answer.txt]\n", ""),
    "judge-empty-inputs": ("benchflow-agent-judge", "inputs: [/app/answer.txt]", "inputs: []"),
}


def _variants(folder: Path) -> list[Path]:
    """The `VARIANTS` as task folders under `folder`."""
    made = []
    for name, (fixture, old, new) in VARIANTS.items():
        task = folder / name
        shutil.copytree(FIXTURES / fixture, task)
        doc = task / "verifier" / "verifier.md"
        assert old in doc.read_text(), name
        doc.write_text(doc.read_text().replace(old, new))
        made.append(task)
    criteria = folder / "kit-criteria-bad-method" / "verifier" / "rewards" / "criteria.toml"
    criteria.write_text('[scoring]\naggregation = "median"\n[[criterion]]\nname = "a"\n')
    return made


def newer_python() -> Path | None:
    """A CPython 3.12 or later to make BenchFlow's virtualenv with: this interpreter when it is
    one, else pyenv's newest (``~/.pyenv/versions/3.1N*``), else ``python3.1N`` on ``PATH``; None
    when there is none."""
    if sys.version_info >= (3, 12):
        return Path(sys.executable)
    pyenv = sorted(
        (Path.home() / ".pyenv" / "versions").glob("3.1[2-9]*/bin/python3"),
        key=lambda path: [int(part) for part in path.parents[1].name.split(".") if part.isdigit()],
    )
    if pyenv:
        return pyenv[-1]
    found = [shutil.which(f"python3.{minor}") for minor in range(19, 11, -1)]
    return next((Path(path) for path in found if path), None)


@pytest.fixture(scope="module")
def benchflow_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv's python that imports `BENCHFLOW` (installed from PyPI without its heavy
    dependencies)."""
    python = newer_python()
    if python is None:
        pytest.skip(f"{BENCHFLOW} needs CPython 3.12 or later, and none is installed (pyenv or PATH)")
    venv = tmp_path_factory.mktemp("benchflow") / "venv"
    subprocess.run([UV, "venv", "--quiet", "--python", str(python), str(venv)], check=True, timeout=120)
    install = [UV, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python")]
    subprocess.run([*install, "--no-deps", BENCHFLOW], check=True, timeout=600)
    subprocess.run([*install, *BENCHFLOW_DEPENDENCIES], check=True, timeout=600)
    return venv / "bin" / "python"


def test_reroll_loads_what_benchflow_accepts(benchflow_python: Path, tmp_path: Path) -> None:
    tasks = [
        folder
        for parent in (ROOT / "examples" / "tasks", FIXTURES)
        for folder in sorted(parent.iterdir())
        if (folder / "task.md").is_file() or (folder / "task.toml").is_file()
    ]
    tasks += _variants(tmp_path)
    done = subprocess.run(
        [str(benchflow_python), "-c", CHECK, *map(str, tasks)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    benchflow = json.loads(done.stdout)
    disagreements, healed = {}, []
    for task in tasks:
        try:
            load_task(task)
            ours = "loads"
        except TaskError as exc:
            ours = f"refused: {exc}"
        issues = benchflow[str(task)]
        agree = (not issues) == (ours == "loads")
        if not agree and task.name not in KNOWN:
            disagreements[task.name] = f"benchflow: {issues or 'ok'}; reroll: {ours}"
        if agree and task.name in KNOWN:
            healed.append(task.name)
    assert disagreements == {}
    assert healed == [], "these agree now: take them out of KNOWN"
    assert set(KNOWN) <= {task.name for task in tasks}, "a known disagreement names no task any more"
