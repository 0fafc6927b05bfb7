"""The test-script verifier: score the workspace the agent left behind with the task's test script.

`TestScriptVerifier` is its face on the verifier seam (`reroll.rollout.verify.verifiers`, the task's
``verifier.type: test-script``, the default); the functions below are its steps, which the
conformance suite also calls one by one.

The hardening lives in the sidecar (``reroll_sidecar.verify``; the PrepareVerify and Verify
RPCs); this module is its host side. `prepare`, before the agent runs, records the baseline
(start-up hooks, a snapshot of them and of the build-config files, the image's trusted pytest
plugins) with the task's hardening options and declared pytest plugins (`declared_plugins`).
`quiesce` freezes, then kills, every process the agent left (the rollout calls it as soon as the
agent is done, before the workspace is hashed). `verify` quiesces again, only then uploads
the verifier folder (no process of the agent ever sees the hidden tests), then one Verify RPC
quiesces once more, undoes planted build config and start-up hooks, deletes old reward files,
runs ``test.sh`` (or the task's ``verifier.command``, BenchFlow's script strategy, through
`command_script`) in a clean environment and reads ``<logs>/verifier/reward.txt`` (one float) or
``reward.json`` (an object of numbers, or the structured form of `reroll_contracts.reward`: its
items, events, space and granularity become the verdict's ``result``), the wire formats BenchFlow
and Harbor use. A script that left no reward file, or ran pytest that never started
(`crashed_before_its_tests`), is a verifier error (``verifier_error``), never a reward of 0
for the agent. The run
folder's ``verifier/`` gets ``hardening.json`` (what hardening did, written before the script runs),
``test-stdout.txt`` / ``test-stderr.txt`` (written as the script runs), the reward file and
``pytest-report.txt`` (what pytest's own report said, when the script ran pytest: rewards above
the share of tests that passed are zeroed, all of them when pytest ended without a report). A soft
verify (between the rounds of a trial) is fenced (``reroll_sidecar.fence``): afterwards every
process it started is killed, the agent's folders are put back as they were before it and new
files elsewhere are deleted; ``cleanup.txt`` says what was done, and a change it cannot undo ends the trial.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reroll_contracts.errors import (
    NeedsInternetError,
    SandboxError,
    TaskError,
    VerifierError,
    VerifyLeftoverError,
)
from reroll_contracts.hardening import HardeningOptions
from reroll_contracts.reward import VerifyResult, parse_reward_json

from reroll.agents import AgentSpec
from reroll.environment.state import query_state
from reroll.rollout.verify.failures import Diagnosis, diagnose
from reroll.rollout.verify.phase_network import verify_network
from reroll.rollout.verify.verifiers import DEFAULT_VERIFIER, Verdict, VerifyRequest
from reroll.runfolder.paths import (
    HARDENING_FILE,
    PYTEST_REPORT_FILE,
    REWARD_FILES,
    STATE_QUERY_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    VerifierPaths,
)
from reroll.sandbox.base import Sandbox
from reroll.sandbox.layout import SandboxLayout
from reroll.sandbox.results import HardeningReport, VerifyBaseline, VerifyOutcome, VerifyScript
from reroll.tasks.compat import resolve_env
from reroll.tasks.rubric import COMMAND_SCRIPT, command_files, task_policy
from reroll.tasks.task import Task

TEST_SCRIPT = "test.sh"
OUTPUT_TAIL_CHARS = 1500
"""How much of the end of the test script's output a VerifierError quotes."""
JUNIT_OPTION = re.compile(r"(^|[^\w-])--junit-?xml([=\s]|$)", re.MULTILINE)
"""pytest's own JUnit report asked for in a test script (``--junitxml`` or ``--junit-xml``)."""
CTRF_OPTION = re.compile(r"(^|[^\w-])--ctrf([=\s]|$)", re.MULTILINE)
"""pytest-json-ctrf's option in a test script: its plugin (``ctrf``) is then declared."""
PYTEST_COMMAND = re.compile(r"(^|[^\w.-])pytest([^\w.-]|$)", re.MULTILINE)
"""pytest named in a test script (``pytest``, ``python -m pytest``, ``uvx … pytest``), not as a
part of another name (``pytest-json-ctrf``, ``pytest_plugins``)."""


async def prepare(sandbox: Sandbox, task: Task, env: dict[str, str]) -> VerifyBaseline:
    """Record the verification baseline in `sandbox` before the agent runs; `verify` needs it.

    Args:
        sandbox: the started sandbox, agent installed but not yet run.
        task: the task whose ``verifier.hardening`` options apply.
        env: the base environment of sandbox processes (its PATH finds ``python3``).

    Raises:
        SandboxError: the scan or the snapshot failed, or the sandbox died.
    """
    return await sandbox.prepare_verify(effective_hardening(task), env, declared_plugins(task))


def effective_hardening(task: Task) -> HardeningOptions:
    """`task`'s ``verifier.hardening``, with ``pytest_report`` off when its ``test.sh`` passes
    pytest a JUnit report of its own (``--junitxml``/``--junit-xml`` outside a comment): pytest
    keeps the last one given, so the sidecar's report would never be written and an honest run
    would be zeroed; the task's reward file is its reward (Harbor's rule)."""
    hardening = task.spec.verifier.hardening
    if hardening.pytest_report and JUNIT_OPTION.search(_uncommented_script(task)):
        return hardening.model_copy(update={"pytest_report": False})
    return hardening


def declared_plugins(task: Task) -> list[str]:
    """The pytest plugins `task` declares (``verifier.pytest_plugins``), plus ``ctrf`` when its
    ``test.sh`` passes ``--ctrf`` outside a comment, as BenchFlow infers it: test scripts often
    install pytest-json-ctrf themselves (``pip install`` or ``uvx --with``) while they run, so no
    scan before the agent sees it."""
    plugins = list(task.spec.verifier.pytest_plugins)
    if CTRF_OPTION.search(_uncommented_script(task)) and "ctrf" not in plugins:
        plugins.append("ctrf")
    return plugins


def _uncommented_script(task: Task) -> str:
    """`task`'s ``test.sh`` without its comments (what follows a ``#``); "" when it is missing
    (`verify`'s error to report). A task with a ``verifier.command``: the command, then each file
    of the verifier folder it names (`command_files`: ``grade.py``, ``./run.sh``), so pytest named
    in either counts."""
    command = task.spec.verifier.command
    try:
        if command is None:
            texts = [(task.verifier_dir / TEST_SCRIPT).read_text(encoding="utf-8", errors="replace")]
        else:
            files = command_files(command, task.verifier_dir)
            texts = [command, *(path.read_text(encoding="utf-8", errors="replace") for path in files)]
    except (OSError, TaskError):  # gone since the task loaded: the verify reports it
        return ""
    return "\n".join(line.split("#", 1)[0] for text in texts for line in text.splitlines())


def script_name(task: Task) -> str:
    """What the sidecar runs in the uploaded verifier folder: ``test.sh``, or `COMMAND_SCRIPT`
    (`command_script`) for a task with a ``verifier.command``."""
    return TEST_SCRIPT if task.spec.verifier.command is None else COMMAND_SCRIPT


def command_script(command: str) -> bytes:
    """The script that runs a script strategy's `command` as BenchFlow 0.7.11 runs it: from the
    verifier folder (where the script lies), with ``bash -c`` (``sh -c`` in an image without
    bash), after ``chmod +x`` of its first word when that is a path (``./run.sh``). Its output and
    exit status are the command's; everything around it (clean environment, hardening, time
    limit, reward files) is test.sh's.

    Raises:
        TaskError: `command` does not split into words as a shell would, or has none.
    """
    try:
        first = shlex.split(command)[0]
    except (ValueError, IndexError) as exc:
        raise TaskError(f"verifier command {command!r} is not a shell command") from exc
    chmod = f"chmod +x -- {shlex.quote(first)} || exit 1\n" if "/" in first else ""
    quoted = shlex.quote(command)
    return (
        "#!/bin/sh\n"
        "# Written by reroll: verifier.md's script strategy command, run from this folder.\n"
        'cd "$(dirname "$0")" || exit 1\n'
        f"{chmod}"
        f"if command -v bash >/dev/null 2>&1; then exec bash -c {quoted}; fi\n"
        f"exec sh -c {quoted}\n"
    ).encode()


PYTEST_DID_NOT_START = re.compile(
    r"No module named pytest|pytest: (command )?not found|pytest: error:|error: unrecognized arguments"
)
"""What a pytest that never started prints: not installed, or its command line refused."""
REFUSED_BECAUSE_OF_THE_AGENT = "not loaded: "
"""The start of a hardening note about a pytest plugin the agent installed or shadowed
(`reroll_sidecar.pytest_plugins`): a pytest that then refuses its command line is the agent's doing."""


def crashed_before_its_tests(task: Task, outcome: VerifyOutcome) -> bool:
    """Whether the test script ended without running its tests, so its zero reward is the
    verifier's failure, not the agent's: it runs pytest (named outside a comment), pytest's own
    report was watched (``verifier.hardening``'s ``pytest_addopts`` and ``pytest_report``, the
    defaults) and pytest never started — its output says it is not installed (a ``pip install``
    that failed), or that it refused its command line (``--ctrf`` without pytest-json-ctrf) — and
    no reward is above 0. Never when the hardening refused a plugin the agent installed or
    shadowed (then pytest's refusal is the agent's doing, and its 0 stands: the agent cannot turn
    its failure into a verifier error that way). A test script that scores without pytest, or
    falls back to something else when pytest is missing, is judged by its reward alone."""
    hardening = effective_hardening(task)
    return (
        hardening.pytest_addopts
        and hardening.pytest_report
        and not outcome.timed_out
        and not outcome.pytest_report  # empty: pytest never started (its log file was never made)
        and not any(outcome.rewards.values())
        and PYTEST_COMMAND.search(_uncommented_script(task)) is not None
        and PYTEST_DID_NOT_START.search(outcome.output_text()) is not None
        and not any(REFUSED_BECAUSE_OF_THE_AGENT in note for note in outcome.hardening.notes)
    )


KEPT_LOG_BYTES = 64 * 1024 * 1024
"""How much of the sandbox's ``<logs>/verifier`` a run folder keeps, in bytes (files in path order)."""
REROLL_VERIFIER_FILES = frozenset(
    {STDOUT_FILE, STDERR_FILE, HARDENING_FILE, *REWARD_FILES, PYTEST_REPORT_FILE}
)
"""Files of ``verifier/`` that reroll writes itself: the sandbox's copies never replace them."""


async def keep_verifier_logs(sandbox: Sandbox, logs_dir: str, output_dir: Path) -> list[str]:
    """Copy what the test script left in the sandbox's `logs_dir` (``/logs/verifier``: its
    ``ctrf.json``, ``junit.xml``, whatever it writes) into the run folder's `output_dir`, whole, as
    Harbor keeps it: regular files only (a symlink, FIFO or device is listed by the manifest and
    never opened), at most `KEPT_LOG_BYTES` in all, never over a file reroll writes
    (`REROLL_VERIFIER_FILES`), never outside `output_dir`.

    Returns:
        The relative paths copied.

    A folder that is missing or cannot be hashed in time keeps nothing.
    """
    try:
        entries = await sandbox.manifest(logs_dir)
    except (VerifierError, SandboxError):  # no such folder, or a tree that takes too long to hash
        return []
    kept: list[str] = []
    budget = KEPT_LOG_BYTES
    folder = output_dir.resolve()
    for relative, digest in entries.items():
        target = (folder / relative).resolve()
        if ":" in digest or relative in REROLL_VERIFIER_FILES or not target.is_relative_to(folder):
            continue
        try:
            data = await sandbox.get_file(f"{logs_dir}/{relative}", max_bytes=budget)
        except (FileNotFoundError, SandboxError):  # gone, or unreadable: the rest is still kept
            continue
        budget -= len(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        kept.append(relative)
        if budget <= 0:
            break
    return kept


def could_not_run(task: Task, outcome: VerifyOutcome) -> Diagnosis | None:
    """Why the test script could not run its tests (`reroll.rollout.verify.failures.diagnose`),
    when it left no reward file, or left only zeroes and pytest never started while its own report
    was watched; None otherwise. Only output from before pytest started counts: the agent's code
    runs inside pytest and must not turn its 0 into a verifier error by printing a resolver's
    message."""
    if outcome.timed_out:
        return None
    if not outcome.reward_error:
        hardening = effective_hardening(task)
        watched = hardening.pytest_addopts and hardening.pytest_report
        if any(outcome.rewards.values()) or not watched or outcome.pytest_report:
            return None
    return diagnose(outcome.output_text())


async def quiesce(sandbox: Sandbox) -> None:
    """Freeze, then kill, every process the agent left in `sandbox` (`Sandbox.kill` of its agent
    user, sparing the task's services: every process started through `Sandbox.exec` and all
    their descendants die, but the services and what they forked).

    Raises:
        QuiesceError: some were still alive after the sandbox's time limit (a verifier error).
        SandboxError: the sandbox failed or died.
    """
    await sandbox.kill(sandbox.layout.agent_user, spare_services=True)


async def soft_verify(sandbox: Sandbox, task: Task, env: dict[str, str], output_dir: Path) -> Verdict:
    """Score the workspace between two rounds of a trial: `verify` without its destructive
    hardening steps (planted build config and start-up hooks are left as the agent left them,
    since it goes on working), fenced in the sandbox (``reroll_sidecar.fence``: every process
    the verify started is killed, the agent's folders are restored to their state before it,
    new files elsewhere deleted), then the verifier folder removed again, so no later round sees
    the hidden tests or anything made of them.

    Raises:
        VerifyLeftoverError: the verify changed what the fence cannot undo (the trial ends).
        As `verify` otherwise.
    """
    try:
        return await verify(sandbox, task, env, output_dir, soft=True)
    finally:
        verifier_dir = sandbox.layout.path(task.verifier_mount)
        await sandbox.exec(["rm", "-rf", "--", verifier_dir], env=env, inherit_env=False)


def keeps_agent_processes(task: Task, agent: AgentSpec, agent_user: str) -> bool:
    """Whether what `agent` leaves running stays alive for the final verify, as the task's own
    harness has it: Harbor (a task in its layout) keeps it, so a server the solution started is
    there for the tests; BenchFlow kills its sandbox user's processes (``pkill -u``) first. Kept
    only where it cannot reach the reward: the task's own solution (the oracle: trusted), or an
    agent with a user of its own (`agent_user`), whose processes the sidecar freezes during the
    hardening and keeps out of the workspace (handed to root) and the verifier's folders. An
    agent running as root could rewrite the tests or the reward: its processes die as before.
    Neither are they kept where the verifier's network policy is looser than the agent's: they
    would gain the verify's network (`reroll.rollout.verify.phase_network.verify_network`), nor
    where the verifier has an allow-list of its own."""
    if task.layout != "legacy" or task.spec.verifier.type != DEFAULT_VERIFIER:
        return False
    networks = task.spec.networks()
    if networks.verifier_looser or networks.verifier_listed:
        return False
    return agent.needs_solution or agent_user not in ("", "root", "0")


async def _stage(
    sandbox: Sandbox, task: Task, env: dict[str, str], verifier_dir: str, output_dir: Path
) -> None:
    """Upload the task's verifier folder to `verifier_dir`, make `output_dir`, put the
    `command_script` of the task's ``verifier.command`` there (`COMMAND_SCRIPT`), when it has one,
    and the environment's state as the verifier receives it next to test.sh (`STATE_QUERY_FILE`), when
    the task queries one.

    Raises:
        EnvironmentStateError: the state's query command failed.
        SandboxError: the sandbox failed or died.
    """
    await sandbox.upload_dir(task.verifier_dir, verifier_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if task.spec.verifier.command is not None:
        script = command_script(task.spec.verifier.command)
        await sandbox.put_file(f"{verifier_dir}/{COMMAND_SCRIPT}", script, mode=0o755)
    state = task.spec.environment.state
    if state is not None and state.query_command is not None:
        queried = (await query_state(sandbox, state.query_command, env)).encode()
        await sandbox.put_file(f"{verifier_dir}/{STATE_QUERY_FILE}", queried, mode=0o644)
        VerifierPaths(output_dir).state_query.write_bytes(queried)


async def verify(
    sandbox: Sandbox,
    task: Task,
    env: dict[str, str],
    output_dir: Path,
    *,
    soft: bool = False,
    keep_processes: bool = False,
) -> Verdict:
    """Run the task's verifier in `sandbox`, hardened as `prepare` recorded, and parse its reward.

    Args:
        sandbox: the started sandbox, agent finished or stopped, `prepare` done before the agent.
        task: the task whose ``test.sh`` (or ``verifier.command``) scores the run.
        env: the base environment of sandbox processes.
        output_dir: host folder (the run folder's ``verifier/``) for the test output and reward file.
        soft: skip the restore of build config and start-up hooks (`soft_verify`).
        keep_processes: the agent's processes are alive and stay so for the script
            (`keeps_agent_processes`); ignored with `soft`.

    Raises:
        VerifierError: the test script is missing (the message names it), timed out, or left no
            valid reward file (the message carries the end of the script's output), or crashed
            before its tests ran (`crashed_before_its_tests`); hardening failed or ran out of time
            (`QuiesceError` when the agent's processes outlived it).
        EnvironmentStateError: the task's ``environment.state.query_command`` failed.
        VerifyLeftoverError: a soft verify left what its fence cannot undo.
        SandboxError: the sandbox failed or died (an infrastructure error).
    """
    started = time.monotonic()
    layout = sandbox.layout
    verifier_dir = layout.path(task.verifier_mount)
    networks = task.spec.networks()
    keep_processes = keep_processes and not soft
    if not keep_processes:
        await quiesce(sandbox)  # before the hidden tests are in the sandbox
    await _stage(sandbox, task, env, verifier_dir, output_dir)
    files_of = VerifierPaths(output_dir)
    with files_of.stdout.open("wb") as out, files_of.stderr.open("wb") as err:
        files = {"stdout": out, "stderr": err}

        def write(name: str, chunk: bytes) -> None:
            files[name].write(chunk)

        def write_report(report: HardeningReport) -> None:
            files_of.hardening.write_text(json.dumps(dataclasses.asdict(report), indent=2))

        try:
            async with verify_network(sandbox, networks) as network_env:
                run = _verify_script(
                    task,
                    layout,
                    env | network_env,
                    verifier_dir,
                    soft=soft,
                    keep_processes=keep_processes,
                    own_network=networks.verifier_stricter,
                )
                outcome = await sandbox.verify(run, on_output=write, on_hardening=write_report)
        except FileNotFoundError as exc:
            raise VerifierError(f"task {task.name}: {exc}") from exc
    await keep_verifier_logs(sandbox, f"{layout.logs_dir}/verifier", output_dir)
    tail = outcome.output_text()[-OUTPUT_TAIL_CHARS:]
    if outcome.timed_out:
        raise VerifierError(f"verifier timed out after {task.spec.verifier.timeout_sec:.0f} s:\n{tail}")
    if outcome.reward_file:
        files_of.reward(outcome.reward_file).write_bytes(outcome.reward_content)
    if outcome.pytest_report:
        files_of.pytest_report.write_text(outcome.pytest_report + "\n")
    if outcome.cleanup or outcome.leftover:
        lines = [*outcome.cleanup, *([f"left over: {outcome.leftover}"] if outcome.leftover else [])]
        files_of.cleanup.write_text("\n".join(lines) + "\n")
    if outcome.leftover:
        raise VerifyLeftoverError(f"task {task.name}: {outcome.leftover}")
    refuse_unscored(task, outcome, tail)
    graded = _graded(outcome, output_dir)
    rewards = graded.flat() if graded is not None else outcome.rewards
    return Verdict(rewards=rewards, duration_seconds=time.monotonic() - started, result=graded)


def _verify_script(
    task: Task,
    layout: SandboxLayout,
    env: dict[str, str],
    verifier_dir: str,
    *,
    soft: bool,
    keep_processes: bool,
    own_network: bool,
) -> VerifyScript:
    """What the sidecar runs to verify (`verify`'s arguments): the task's script in `verifier_dir`
    with `env` and the verifier's ``env``, its timeout and aggregate policy, in the workspace;
    `own_network`: in a loopback-only network namespace (a verifier stricter than the agent).

    Raises:
        TaskError: ``verifier.env`` names a variable the host lacks.
    """
    return VerifyScript(
        verifier_dir=verifier_dir,
        script=script_name(task),
        reward_dir=f"{layout.logs_dir}/verifier",
        env=env | resolve_env(task.spec.verifier.env, os.environ, "verifier.env"),
        timeout_seconds=task.spec.verifier.timeout_sec,
        soft=soft,
        aggregate_policy=task_policy(task.spec.verifier.aggregate_policy),
        keep_agent_processes=keep_processes,
        own_network=own_network,
        cwd=layout.workspace,  # the image's WORKDIR, as the task's own harness runs it
        image_env=layout.image_env,
    )


def refuse_unscored(task: Task, outcome: VerifyOutcome, tail: str) -> None:
    """Raise when the test script's reward is not the agent's: it could not run (`could_not_run`),
    left no valid reward file, or crashed before its tests ran (`crashed_before_its_tests`).

    Raises:
        NeedsInternetError: it tried to download what it runs, and the sandbox has no internet.
        VerifierError: otherwise; the message ends with `tail`, the end of its output.
    """
    if (diagnosis := could_not_run(task, outcome)) is not None:
        error = NeedsInternetError if diagnosis.kind == "offline" else VerifierError
        raise error(f"{diagnosis.message()}; test output:\n{tail}")
    if outcome.reward_error:
        raise VerifierError(f"{outcome.reward_error}; test output:\n{tail}")
    if crashed_before_its_tests(task, outcome):
        raise VerifierError(
            f"the verifier crashed before its tests ran: {_runs(task)} runs pytest, but pytest never "
            "started (not installed, e.g. its pip install failed, or it refused its command line, e.g. "
            f"--ctrf without pytest-json-ctrf), so its reward {dict(outcome.rewards)} is not the agent's; "
            f"test output:\n{tail}"
        )


def _runs(task: Task) -> str:
    """What scores `task`, for a message: ``test.sh``, or its ``verifier.command`` quoted."""
    return TEST_SCRIPT if task.spec.verifier.command is None else f"`{task.spec.verifier.command}`"


def _graded(outcome: VerifyOutcome, output_dir: Path) -> VerifyResult | None:
    """The structured result of the script's ``reward.json``: BenchFlow's graded form as the
    sidecar read it (`VerifyOutcome.graded`), or reroll's structured form
    (`reroll_contracts.reward`); None for reward.txt, the flat form, and when the sidecar zeroed
    the rewards (pytest's own report counted failures: the zeroes stand).

    Raises:
        VerifierError: the structured form is invalid (the message names the file and the field).
    """
    name, content, rewards = outcome.reward_file, outcome.reward_content, outcome.rewards
    if outcome.graded is not None:
        aggregate = outcome.graded.aggregate
        zeroed = aggregate is not None and aggregate.value != rewards.get("reward")
        return None if zeroed else VerifyResult.from_graded(outcome.graded)
    if name != "reward.json":
        return None
    try:
        graded = parse_reward_json(content, str(VerifierPaths(output_dir).reward(name)))
    except ValueError as exc:
        raise VerifierError(str(exc)) from exc
    if graded is None or rewards.get("reward") != graded.reward:
        return None
    return graded


VERDICT_OUTPUT_BYTES = 256 * 1024
"""How much of the end of ``test-stdout.txt`` and of ``test-stderr.txt`` a `Verdict`'s
``output`` holds (each), in bytes: the files in the run folder keep all of it."""


class TestScriptVerifier:
    """The ``test-script`` verifier (`reroll.rollout.verify.verifiers.Verifier`): the task's ``test.sh``,
    hardened as `prepare` recorded; a soft verify is `soft_verify`. Options: none (the test
    script's own settings are the ``verifier`` section's fields).

    Its verdict's ``output`` is the end of the script's stdout then stderr
    (`VERDICT_OUTPUT_BYTES` of each); ``details`` holds ``reward_file`` and ``pytest_report``
    when the script left them.
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        """Raises: TaskError: `options` is not empty (the message names the task)."""
        if options:
            raise TaskError(
                f"task {task.name} ({task.path}): verifier.type test-script takes no verifier.options "
                f"(got {', '.join(sorted(options))})"
            )
        self.task = task

    async def prepare(self, sandbox: Sandbox, env: dict[str, str]) -> None:
        """`prepare`: the verification baseline (see `reroll.rollout.verify.verifiers.Verifier.prepare`)."""
        await prepare(sandbox, self.task, env)

    async def verify(self, request: VerifyRequest) -> Verdict:
        """`verify`, or `soft_verify` for a soft request; a `VerifierError` becomes a verdict
        with status ``error`` (see `reroll.rollout.verify.verifiers.Verifier.verify`).

        Raises:
            SandboxError: the sandbox failed or died.
            RerollError: any other error of `verify` but a `VerifierError` (a soft verify's leftovers).
        """
        started = time.monotonic()
        try:
            verdict = await (
                soft_verify(request.sandbox, self.task, request.env, request.output_dir)
                if request.soft
                else verify(
                    request.sandbox,
                    self.task,
                    request.env,
                    request.output_dir,
                    keep_processes=request.keep_agent_processes,
                )
            )
        except VerifierError as exc:
            verdict = Verdict(
                rewards={},
                duration_seconds=time.monotonic() - started,
                status="error",
                error_category=exc.error_category,
                error=str(exc),
            )
        files_of = VerifierPaths(request.output_dir)
        output = "".join(_tail(file) for file in (files_of.stdout, files_of.stderr))
        details = {
            name: found.name
            for name, found in (
                ("reward_file", files_of.found_reward()),
                ("pytest_report", files_of.pytest_report if files_of.pytest_report.is_file() else None),
            )
            if found is not None
        }
        return dataclasses.replace(verdict, output=output, details=details)


def _tail(path: Path) -> str:
    """The last `VERDICT_OUTPUT_BYTES` of `path`, decoded (invalid bytes replaced); "" when missing."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - VERDICT_OUTPUT_BYTES))
            return file.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
