"""`reroll task check` on a folder mixing valid, foreign-field and broken tasks (in process)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from reroll.cli.app import app
from reroll.cli.common import console
from reroll.rollout.start import load_runnable_task
from reroll.rollout.verify.judge_model import judge_model_warnings
from reroll.sandbox.local import imagebuild
from reroll.tasks.check import find_task_dirs, program_source, resolved
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError
from typer.testing import CliRunner


def test_task_check_of_a_mixed_folder(tmp_path: Path, examples: Path) -> None:
    shutil.copytree(examples / "hello-file", tmp_path / "valid")
    foreign = tmp_path / "nested" / "harbor"
    (foreign / "tests").mkdir(parents=True)
    (foreign / "tests" / "test.sh").write_text("#!/bin/sh\n")
    (foreign / "instruction.md").write_text("Do it.\n")
    (foreign / "task.toml").write_text(
        'version = "1.0"\n[environment]\nmemory = "4G"\ngpus = 1\nallow_internet = false\n'
        '[[steps]]\nname = "a"\n'
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "task.md").write_text("---\nagent:\n  timeout_sec: -1\n---\nDo it.\n")
    (broken / "verifier").mkdir()
    (broken / "verifier" / "test.sh").write_text("#!/bin/sh\n")
    (tmp_path / "not-a-task").mkdir()  # searched, holds nothing

    done = CliRunner().invoke(app, ["task", "check", str(tmp_path)], terminal_width=200)

    assert done.exit_code == 2, done.output
    assert "2 of 3 tasks load" in done.output
    assert f"{broken}: does not load" in done.output and "greater than 0" in done.output
    assert "environment.memory → environment.memory_mb" in done.output
    assert "4096 MiB" in done.output and "network              │ none" in done.output
    assert "environment.gpus: GPUs are not attached" in done.output
    assert "steps: multi-step tasks are not supported" in done.output


def test_task_check_exits_0_when_every_task_loads(examples: Path) -> None:
    done = CliRunner().invoke(app, ["task", "check", str(examples)], terminal_width=200)
    assert done.exit_code == 0, done.output
    count = len(find_task_dirs(examples))
    assert count >= 7 and f"{count} of {count} tasks load" in done.output


def test_task_check_of_a_folder_without_tasks(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["task", "check", str(tmp_path)], terminal_width=200)
    assert done.exit_code == 2
    assert "no task.md or task.toml in it or below it" in done.output


def test_task_check_of_the_compose_example(examples: Path) -> None:
    """mail-calendar's compose form: both images built from the original's folder (compose's
    ``build``, its context named from the task), the ``mail`` service a sibling container gated
    on its compose healthcheck, the MCP server reaching it by name; nothing ignored."""
    task = examples / "mail-calendar-compose"
    done = CliRunner().invoke(app, ["task", "check", str(task)], terminal_width=200)
    assert done.exit_code == 0 and "1 of 1 tasks load" in done.output, done.output
    assert "ignored" not in done.output.split("mail-calendar-compose  (", 1)[1]
    rows = dict(resolved(load_task(task)))
    assert rows["image (docker)"] == "Dockerfile in ../mail-calendar/environment/"
    assert rows["service mail"] == (
        "image built from Dockerfile in ../mail-calendar/environment/ (a sibling container, docker only, "
        "command python3 /app/.services/mail/service.py --db /var/lib/mail/mail.db --port 9001); "
        "ready: `python3 -c \"import urllib.request as u; u.urlopen('http://localhost:9001/health', "
        'timeout=2)"` exits 0 (every 0.5 s, 3 retries)'
    )
    assert rows["mcp mail"] == "stdio python3 /app/.services/mail/mcp_server.py --url http://mail:9001"
    assert rows["env"] == "MAIL_URL" and rows["verifier"] == "tests/test.sh → /tests, run as root"


def test_task_check_reports_a_harbor_skills_dir_it_does_not_apply(tmp_path: Path) -> None:
    """Issue 29 (13): Harbor's ``environment.skills_dir`` is named with what reroll does instead."""
    task = tmp_path / "harbor"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text("#!/bin/sh\n")
    (task / "instruction.md").write_text("Do it.\n")
    (task / "task.toml").write_text('[environment]\nskills_dir = "/root/.skills"\n')
    rows = dict(resolved(load_task(task)))
    assert "/root/.skills" in rows["skills"] and "not mounted" in rows["skills"]


def _dockerfile_task(root: Path, dockerfile: str | None, toml: str = "") -> Path:
    """A Harbor-layout task whose environment/Dockerfile is `dockerfile` (none: no Dockerfile)."""
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test.sh").write_text("#!/bin/sh\n")
    (root / "instruction.md").write_text("Do it.\n")
    (root / "task.toml").write_text(toml)
    if dockerfile is not None:
        (root / "environment").mkdir()
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    return root


def _check(folder: Path, docker: bool = False) -> str:
    """`reroll task check FOLDER`'s output, on a console wide enough for a warning's line, on a
    machine with Docker (`docker`) or without (default), never with buildah."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(console, "_width", 400)
        patch.setattr(
            imagebuild, "docker_unreachable", lambda: "" if docker else "Docker is not reachable (none here)"
        )
        patch.setattr(imagebuild, "buildah_missing", lambda: "buildah is not installed (none here)")
        done = CliRunner().invoke(app, ["task", "check", str(folder)])
    assert done.exit_code == 0, done.output  # warnings do not fail the check
    return done.output


def test_task_check_warns_about_a_base_with_no_stand_in_and_names_the_flag(tmp_path: Path) -> None:
    """Issue 29 (6): a FROM no registry-less machine can build said "ok"; now a warning naming the
    one flag that works (a pip Dockerfile gets a base with pip)."""
    _dockerfile_task(tmp_path / "unbuildable", "FROM example.invalid/nothing:1\nRUN pip install pandas\n")
    output = _check(tmp_path / "unbuildable")
    assert "│ ok " not in output and "1 with warnings" in output
    assert "FROM example.invalid/nothing:1" in output and "no stand-in" in output
    assert "--image-map example.invalid/nothing:1=reroll/debian:bookworm-python" in output


def test_task_check_warns_about_a_prebuilt_image_with_no_stand_in(
    tmp_path: Path, host_pythons: Callable[..., None]
) -> None:
    host_pythons()  # no CPython 3.12 to stand in
    _dockerfile_task(tmp_path / "prebuilt", None, '[environment]\ndocker_image = "python:3.12-slim"\n')
    output = _check(tmp_path / "prebuilt")
    assert "--image-map python:3.12-slim=reroll/debian:trixie-python" in output
    assert "needs its image (environment.docker_image = python:3.12-slim)" in output
    assert "Docker is not reachable" in output and "--sandbox docker" in output


def test_task_check_has_no_base_warning_for_python_3_12_or_3_10_where_the_host_has_that_cpython(
    tmp_path: Path, host_pythons: Callable[..., None]
) -> None:
    """Issue 29: ``FROM python:3.12.9-slim`` and ``python:3.10-slim`` stand in with the host's
    CPython (``reroll/debian:bookworm-python3.X``): no base warning, as the build needs no flag."""
    host_pythons("3.10.13", "3.12.1")
    for name, base in (("py312", "python:3.12.9-slim"), ("py310", "python:3.10-slim")):
        _dockerfile_task(tmp_path / name, f"FROM {base}\nRUN pip install numpy==1.23.0\n")
        output = _check(tmp_path / name, docker=True)
        assert "no stand-in" not in output and "--image-map" not in output, output


def test_task_check_warns_that_local_cannot_build_a_dockerfile_that_installs_without_docker(
    tmp_path: Path,
) -> None:
    """Issue 29 (6): a task that needs its image (RUN, COPY) on the default ``local`` where no
    Docker builds it is refused there: the check says so, naming the lines and the fix; a COPY of
    workspace/ is what local's host view seeds anyway."""
    _dockerfile_task(
        tmp_path / "installs",
        "FROM python:3.13-slim-bookworm\nCOPY workspace/ /app/\n"
        "RUN apt-get update && apt-get install -y jq\n",
    )
    output = _check(tmp_path / "installs")
    assert "│ ok " not in output and "1 with warnings" in output
    assert "RUN apt-get update && apt-get install -y jq" in output and "--sandbox docker" in output
    assert "COPY workspace/ /app/" not in output
    assert "no stand-in" not in output  # python:3.13-slim-bookworm has one


def test_task_check_says_ok_for_a_task_local_builds_with_docker(
    tmp_path: Path,
) -> None:
    """Where Docker answers, local runs such a task on its image: no warning."""
    _dockerfile_task(tmp_path / "installs", "FROM reroll/base:bookworm\nRUN apt-get install -y jq\n")
    output = _check(tmp_path / "installs", docker=True)
    assert "│ ok " in output and "warning" not in output


def test_task_check_says_ok_for_a_task_local_runs_as_docker_would(tmp_path: Path) -> None:
    _dockerfile_task(tmp_path / "plain", "FROM reroll/base:bookworm\nCOPY workspace/ /app/\nWORKDIR /app\n")
    output = _check(tmp_path / "plain")
    assert "│ ok " in output and "warning" not in output


def test_task_check_shows_each_mcp_servers_tool_filters() -> None:
    """BenchFlow's ``tools``, ``include_tags`` and ``exclude_tags`` on a task's MCP servers: the
    task loads and each server's row names its filters."""
    task = Path(__file__).parents[1] / "fixtures" / "benchflow-mcp-filters"
    done = CliRunner().invoke(app, ["task", "check", str(task)], terminal_width=200)
    assert done.exit_code == 0 and "1 of 1 tasks load" in done.output, done.output
    rows = dict(resolved(load_task(task)))
    assert (
        rows["mcp mail"]
        == "stdio python3 /app/mail_mcp.py; tools list_messages, archive_message; tags +inbox -admin"
    )
    assert rows["mcp calendar"] == "streamable-http http://calendar:9002/mcp; tags -write"


def test_task_check_shows_a_script_strategys_command() -> None:
    """BenchFlow's script strategy with ``python3 grade.py ...``: the task loads and the
    verifier row says what runs, from where."""
    task = Path(__file__).parents[1] / "fixtures" / "benchflow-script-strategy"
    done = CliRunner().invoke(app, ["task", "check", str(task)], terminal_width=200)
    assert done.exit_code == 0 and "1 of 1 tasks load" in done.output, done.output
    assert "warning" not in done.output
    assert dict(resolved(load_task(task)))["verifier"] == (
        "verifier/ → /verifier; runs `python3 grade.py --expected expected.txt` there, as root"
    )


def test_task_check_shows_which_agent_judge_runs(examples: Path) -> None:
    """BenchFlow's agent-judge (role, isolation, inputs) is one judge call; with reroll's
    ``agent`` it is an agent in a sandbox of its own. A role BenchFlow would refuse fails the check."""
    fixture = Path(__file__).parents[1] / "fixtures" / "benchflow-agent-judge"
    assert dict(resolved(load_task(fixture)))["verifier"] == (
        "agent-judge: one judge call over /app/answer.txt, role reviewer (no test.sh)"
    )
    assert dict(resolved(load_task(examples / "changelog-entry")))["verifier"] == (
        "agent-judge: agent mini-swe-agent in a sandbox of its own, role judge, told /app/CHANGES.md "
        "(no test.sh)"
    )


def test_task_check_refuses_an_agent_judge_benchflow_refuses(tmp_path: Path) -> None:
    task = tmp_path / "judge"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "benchflow-agent-judge", task)
    verifier_md = task / "verifier" / "verifier.md"
    verifier_md.write_text(verifier_md.read_text().replace("      isolation: verifier-only\n", ""))
    done = CliRunner().invoke(app, ["task", "check", str(task)], terminal_width=200)
    assert done.exit_code == 2 and "must declare isolation" in done.output, done.output


def test_task_check_shows_the_aggregate_policy(tmp_path: Path) -> None:
    """verifier.md's ``outputs.aggregate_policy`` (BenchFlow's graded rewards) has a row of its own;
    a task without one says which part of reward.json decides."""
    task = tmp_path / "graded"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "benchflow-script-strategy", task)
    assert dict(resolved(load_task(task)))["aggregate"] == "all_pass (verifier.md's aggregate_policy)"
    verifier_md = task / "verifier" / "verifier.md"
    verifier_md.write_text(
        verifier_md.read_text().replace(
            "      method: all_pass\n",
            "      method: weighted_mean\n      weights: {tests: 0.75, docs: 0.25}\n"
            "      criteria: [tests, docs]\n",
        )
    )
    assert dict(resolved(load_task(task)))["aggregate"] == (
        "weighted_mean; weights tests 0.75, docs 0.25; criteria tests, docs (verifier.md's aggregate_policy)"
    )
    verifier_md.write_text(verifier_md.read_text().split("  outputs:")[0] + "---\n")
    assert dict(resolved(load_task(task)))["aggregate"].startswith("reward.json's own aggregate")


def test_task_check_refuses_what_a_run_refuses(tmp_path: Path, examples: Path) -> None:
    """task check loads a task as `reroll run` does (`load_runnable_task`: the verifier is built
    too), so an llm-judge task without its rubric does not load, as a run refuses it (exit 2)."""
    task = tmp_path / "no-rubric"
    shutil.copytree(examples / "release-note", task)
    shutil.rmtree(task / "verifier" / "rubrics")
    verifier_md = task / "verifier" / "verifier.md"
    verifier_md.write_text(verifier_md.read_text().replace("      rubric: rubrics/verifier.toml\n", ""))
    done = CliRunner().invoke(app, ["task", "check", str(task)], terminal_width=200)
    assert done.exit_code == 2, done.output
    assert "does not load" in done.output and "an llm-judge task needs a rubric" in done.output
    with pytest.raises(TaskError, match="an llm-judge task needs a rubric"):
        load_runnable_task(task)


@pytest.mark.parametrize("example", ["release-note", "changelog-entry"])
def test_task_check_warns_about_a_judge_model_a_run_refuses(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch, example: str
) -> None:
    """A judge named as BenchFlow names it (``model: claude-sonnet-4-6``) without its key: the
    task loads (BenchFlow's check_task does not look at the judge's model) with a warning naming
    the variable and --judge-model; with the key set, no warning."""
    for name in ("ANTHROPIC_API_KEY", "REROLL_UPSTREAM_URL"):
        monkeypatch.delenv(name, raising=False)
    task = tmp_path / example
    shutil.copytree(examples / example, task)
    verifier_md = task / "verifier" / "verifier.md"
    verifier_md.write_text(
        re.sub(r"model: scripted:\S+", "model: claude-sonnet-4-6", verifier_md.read_text())
    )
    output = _check(task, docker=True)
    assert "1 warning" in output, output
    assert "a run here refuses it before the agent starts (exit 2)" in output
    assert "needs ANTHROPIC_API_KEY" in output and "--judge-model" in output
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    assert judge_model_warnings(load_runnable_task(task)) == []


def test_task_check_says_where_a_services_program_comes_from(examples: Path) -> None:
    """An in-sandbox service's program from the task's environment/workspace is named so; one the
    task folder does not hold comes only from the image (BenchFlow's manifests install entry points
    such as ``claw-gmail`` in a base image), and task check says so instead of nothing."""
    environment = load_task(examples / "mail-calendar").spec.environment
    (mail,) = environment.services
    assert program_source(mail, environment, examples / "mail-calendar") == (
        "/app/.services/mail/service.py from the task's environment/workspace/.services/mail/service.py"
    )
    image_only = mail.model_copy(update={"command": "claw-gmail --db /data/gmail.db serve --port 9001"})
    assert program_source(image_only, environment, examples / "mail-calendar") == (
        "claw-gmail is not in the task folder: only the sandbox's image (the task's image) has it"
    )
    missing = mail.model_copy(update={"command": "python3 /app/.services/mail/gone.py"})
    assert "gone.py is not in the task folder" in program_source(
        missing, environment, examples / "mail-calendar"
    )


def test_task_check_shows_each_phase_s_network_policy() -> None:
    """BenchFlow's per-phase ``network_mode`` is mapped, shown per phase, and not reported ignored."""
    fixture = Path(__file__).parents[1] / "fixtures" / "benchflow-phase-network"
    done = CliRunner().invoke(app, ["task", "check", str(fixture)], terminal_width=200)
    assert done.exit_code == 0, done.output
    assert re.search(r"network\s+│ agent \(and oracle\) none, verifier full", done.output), done.output
    assert "verifier.network_mode → verifier.network = full" in done.output
    assert "not enforced" not in done.output and "per-phase" not in done.output


def test_task_check_shows_each_phase_s_allow_list() -> None:
    """BenchFlow's ``allowed_hosts`` per phase: shown with the phase's policy, not reported ignored."""
    fixture = Path(__file__).parents[1] / "fixtures" / "benchflow-allowlist"
    output = _check(fixture)  # on a console wide enough for the row's one line
    row = "agent (and oracle) none + allowed: pypi.org, files.pythonhosted.org, "
    row += "verifier none + allowed: 10.251.7.3"
    assert row + " (every port; names resolved on the host)" in output, output
    assert "allowed_hosts" not in output and "not enforced" not in output


def test_task_check_shows_a_deny_list_s_hosts_and_urls_as_enforced() -> None:
    """BenchFlow's ``blocked_hosts`` and ``blocked_urls``: shown on the agent phase's row (the URLs
    spelt as BenchFlow does), neither reported ignored."""
    output = _check(Path(__file__).parents[1] / "fixtures" / "benchflow-denylist")
    row = "agent (and oracle) full - denied: answers.example.com (and their subdomains); URLs under "
    row += "https://github.com/org/answers, https://docs.example.com/solutions (HTTP(S) only, through an "
    row += "interceptor), verifier full"
    assert row in output, output
    assert "blocked_urls" not in output and "not enforced" not in output


def test_task_check_finds_an_interpreted_script_named_from_the_service_s_folder() -> None:
    """``python3 counter.py serve`` runs counter.py from the service's folder (the working folder):
    task check names the task's environment/workspace copy, not only the image."""
    fixture = Path(__file__).parents[1] / "fixtures" / "benchflow-manifest-reset"
    environment = load_task(fixture).spec.environment
    (counter,) = environment.services
    assert program_source(counter, environment, fixture) == (
        "counter.py from the task's environment/workspace/counter.py"
    )
    elsewhere = counter.model_copy(update={"workdir": "/srv"})
    assert "counter.py is not in the task folder" in program_source(elsewhere, environment, fixture)
