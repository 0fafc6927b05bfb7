"""Where everything of a run folder, a job folder and a branch tree lies: the one owner of their paths.

Every other module asks these objects for a path instead of joining a name to a folder itself
(``tests/runfolder/test_paths.py`` fails on a module outside ``runfolder/`` that does)::

    RunPaths(run_dir).config            <run>/config.json
    RunPaths(run_dir).harness_part("judge")   <run>/harness/judge (harness/ created, 0700)
    RunPaths(run_dir).checkpoint(3).record    <run>/checkpoints/step-3/checkpoint.json
    RunPaths(run_dir).verifier.judge    <run>/verifier/judge.json
    JobPaths(job_dir).spec              <job>/job.json

The names themselves stay the constants of `reroll.runfolder.run` (the run folder's layout, drawn in
its docstring), `reroll.runfolder.folders`, `reroll.runfolder.summary`, `reroll.runfolder.asks` and
`reroll.runfolder.trial`; the names of files that a feature writes into the run folder are declared
here (the verifier's folder, a checkpoint's folder). Nothing here reads or writes a file, except that
`RunPaths.make_harness` creates ``harness/`` with its mode: the readers and writers of each file's
shape are the modules named beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal

from reroll.runfolder.asks import ASKS_FILE
from reroll.runfolder.folders import ATTEMPTS_DIR, BRANCHED_DIR, CONTINUED_DIR, JOB_SPEC_FILE, REPLAYED_DIR
from reroll.runfolder.run import (
    AGENT_LOG,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    CONTROLLER_LOG,
    ERROR_FILE,
    FIDELITY_FILE,
    HARNESS_DIR,
    HELD_FILE,
    JUDGE_TRAJECTORY,
    LIMITS_FILE,
    MANIFEST_FILE,
    PROMPTS_FILE,
    PROXY_CONFIG,
    REMAINDER_FILE,
    RESTORED_FILE,
    RESULT_FILE,
    SERVICES_DIR,
    SERVICES_FILE,
    SIDE_TRAJECTORIES,
    TRAJECTORY,
    USER_TRAJECTORY,
    VERIFIER_DIR,
    HarnessPart,
    harness_folder,
    harness_part,
)
from reroll.runfolder.store import STORE_DIR
from reroll.runfolder.summary import JOB_SUMMARY_FILE, TREE_SUMMARY_FILE
from reroll.runfolder.trial import TRIAL_RECORD

RESCORED_DIR = "rescored"
"""Beside a run folder: ``reroll rescore``'s re-scored runs."""
SETUP_LOG = "setup.log"
"""In ``services/``: every ``setup`` command's output, each under a header line
(`reroll.environment.setup`)."""
ROUNDS_DIR = "rounds"
"""In ``verifier/``: a trial's per-turn verifications, ``rounds/<turn>/`` each
(`reroll.rollout.turns.scenes`)."""
JUDGE_FILE = "judge.json"
"""In the verifier's folder: an LLM judge's record (`reroll.rollout.verify.judge`)."""
AGENT_JUDGE_FILE = "agent_judge.json"
"""In the verifier's folder: an agent judge's record (`reroll.rollout.verify.agent_judge`)."""
JUDGE_RUN_DIR = "judge"
"""In the verifier's folder: an agent judge's own run folder (`reroll.rollout.verify.agent_judge`)."""
JUDGE_INPUTS_DIR = "agent-judge-inputs"
"""In the verifier's folder: an input judge's copies of the sandbox files it judged
(`reroll.rollout.verify.input_judge`)."""
EPISODE_INPUTS_DIR = "ors-episode-inputs"
"""In the verifier's folder: an ORS episode's copies of the sandbox files it scored
(`reroll.rollout.verify.ors_episode`)."""
DETAILS_FILE = "reward-details.json"
"""In the verifier's folder: the per-item details of an input judge's or an ORS episode's reward
(`reroll.rollout.verify.input_judge`, `reroll.rollout.verify.ors_episode`)."""
STATE_QUERY_FILE = "environment_state.txt"
"""In the verifier's folder (and next to test.sh in the sandbox): the environment's state as the
verifier received it (`reroll.environment.state.query_state`)."""
STDOUT_FILE = "test-stdout.txt"
"""In the verifier's folder: the script verifier's test.sh's stdout."""
STDERR_FILE = "test-stderr.txt"
"""In the verifier's folder: the script verifier's test.sh's stderr."""
HARDENING_FILE = "hardening.json"
"""In the verifier's folder: the hardening the script verifier applied before test.sh ran."""
REWARD_FILES = ("reward.txt", "reward.json")
"""In the verifier's folder: the reward file test.sh wrote, copied out (the first found counts)."""
PYTEST_REPORT_FILE = "pytest-report.txt"
"""In the verifier's folder: the script verifier's pytest report (`reroll.rollout.verify.script_verifier`)."""
CLEANUP_FILE = "cleanup.txt"
"""In the verifier's folder: what the script verifier cleaned up before it ran."""
CHECKPOINT_FILE = "checkpoint.json"
"""In a checkpoint's folder: its `reroll.rollout.layers.LayeredCheckpoint` (the layer files beside it)."""
POOL_FILE = "pool.json"
PROCESS_IMAGES_DIR = "process"
PROCESS_RECORD = "process.json"
PROCESS_FILES = "process-files.tar"
"""In a checkpoint's folder, when the recording sandbox keeps copy-on-write snapshots (``local``
with ``keep_snapshots``): ``{"from_snapshot": "<pool>:step-K"}``, the workspace and HOME at that
step, frozen in the pool the sandbox leaves when it stops
(`reroll.rollout.extensions.checkpoints.pool_reference`)."""
Beside = Literal["continued", "replayed", "branched", "rescored"]
"""What a command that starts from a run folder writes beside it, by default."""
_BESIDE: dict[Beside, str] = {
    "continued": CONTINUED_DIR,
    "replayed": REPLAYED_DIR,
    "branched": BRANCHED_DIR,
    "rescored": RESCORED_DIR,
}


def proxy_config_in(workdir: Path) -> Path:
    """``proxy.json`` in an LLM proxy's working folder: ``harness/`` for the agent's proxy
    (`RunPaths.proxy_config`), ``harness/<part>/`` for a side part's (`RunPaths.harness_part`)."""
    return workdir / PROXY_CONFIG.name


@dataclass(frozen=True)
class VerifierPaths:
    """The files of a verifier's output folder: a run folder's ``verifier/``, a trial turn's
    ``verifier/rounds/<turn>/``, or any folder a verifier was given (`root`)."""

    root: Path

    @property
    def judge(self) -> Path:
        """``judge.json``: an LLM judge's record."""
        return self.root / JUDGE_FILE

    @property
    def agent_judge(self) -> Path:
        """``agent_judge.json``: an agent judge's record."""
        return self.root / AGENT_JUDGE_FILE

    @property
    def judge_run(self) -> Path:
        """``judge/``: an agent judge's own run folder (not created)."""
        return self.root / JUDGE_RUN_DIR

    @property
    def judge_inputs(self) -> Path:
        """``agent-judge-inputs/``: an input judge's copies of the sandbox files it judged."""
        return self.root / JUDGE_INPUTS_DIR

    @property
    def episode_inputs(self) -> Path:
        """``ors-episode-inputs/``: an ORS episode's copies of the sandbox files it scored."""
        return self.root / EPISODE_INPUTS_DIR

    @property
    def details(self) -> Path:
        """``reward-details.json``: the per-item details of a judged reward."""
        return self.root / DETAILS_FILE

    @property
    def state_query(self) -> Path:
        """``environment_state.txt``: the environment's state as the verifier received it."""
        return self.root / STATE_QUERY_FILE

    @property
    def stdout(self) -> Path:
        """``test-stdout.txt``: the script verifier's test.sh's stdout."""
        return self.root / STDOUT_FILE

    @property
    def stderr(self) -> Path:
        """``test-stderr.txt``: the script verifier's test.sh's stderr."""
        return self.root / STDERR_FILE

    @property
    def hardening(self) -> Path:
        """``hardening.json``: the hardening applied before test.sh ran."""
        return self.root / HARDENING_FILE

    def reward(self, name: str) -> Path:
        """The reward file `name` (one of `REWARD_FILES`, as the verifier reported it) in this folder."""
        return self.root / name

    @property
    def reward_json(self) -> Path:
        """``reward.json``: the structured reward (`reroll_contracts.reward`)."""
        return self.reward(REWARD_FILES[1])

    def found_reward(self) -> Path | None:
        """The first of `REWARD_FILES` that is a regular file here; None when neither is."""
        return next((file for file in map(self.reward, REWARD_FILES) if file.is_file()), None)

    @property
    def pytest_report(self) -> Path:
        """``pytest-report.txt``: the script verifier's pytest report."""
        return self.root / PYTEST_REPORT_FILE

    @property
    def cleanup(self) -> Path:
        """``cleanup.txt``: what the script verifier cleaned up before it ran."""
        return self.root / CLEANUP_FILE

    def round(self, turn: int) -> VerifierPaths:
        """``rounds/<turn>/``: a trial turn's own verification (its folder is not created)."""
        return VerifierPaths(self.root / ROUNDS_DIR / str(turn))


@dataclass(frozen=True)
class CheckpointPaths:
    """The files of a checkpoint's folder (`root`): a run folder's ``checkpoints/step-K/``, or a
    checkpoint captured elsewhere (`reroll.rollout.layers`)."""

    root: Path

    @property
    def record(self) -> Path:
        """``checkpoint.json``: the `reroll.rollout.layers.LayeredCheckpoint`."""
        return self.root / CHECKPOINT_FILE

    @property
    def pool(self) -> Path:
        """``pool.json``: the pool snapshot it was taken as."""
        return self.root / POOL_FILE

    def layer(self, name: str) -> Path:
        """A layer's file, by the name its checkpoint record gives it."""
        return self.root / name

    @property
    def process_record(self) -> Path:
        """``process.json``: the process layer's record file (`reroll.rollout.process_layer.ProcessLayer`)."""
        return self.root / PROCESS_RECORD

    @property
    def process_images(self) -> Path:
        """``process/``: CRIU's images of the agent's process tree (`reroll.rollout.process_layer`)."""
        return self.root / PROCESS_IMAGES_DIR

    @property
    def process_files(self) -> Path:
        """``process-files.tar``: the files the tree held open, at their size at its dump."""
        return self.root / PROCESS_FILES


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run folder (`root`; the layout is `reroll.runfolder.run`'s docstring).

    Pure: building one or asking for a path touches no file, except `make_harness` and
    `harness_part` (which create ``harness/``, mode 0700, like `reroll.runfolder.run.harness_folder`).
    """

    root: Path

    @property
    def config(self) -> Path:
        """``config.json``: the `reroll.runfolder.run.RunConfig`."""
        return self.root / CONFIG_FILE

    @property
    def result(self) -> Path:
        """``result.json``: the `reroll.runfolder.run.RunResult`."""
        return self.root / RESULT_FILE

    @property
    def prompts(self) -> Path:
        """``prompts.json``: every prompt sent, a JSON list of strings."""
        return self.root / PROMPTS_FILE

    @property
    def trial(self) -> Path:
        """``trial.json``: the `reroll.runfolder.trial.TrialRecord`."""
        return self.root / TRIAL_RECORD

    @property
    def trajectory(self) -> Path:
        """``trajectory/llm_trajectory.jsonl``: the agent's exchanges."""
        return self.root / TRAJECTORY

    @property
    def judge_trajectory(self) -> Path:
        """``trajectory/judge_trajectory.jsonl``: a judge's exchanges."""
        return self.root / JUDGE_TRAJECTORY

    @property
    def user_trajectory(self) -> Path:
        """``trajectory/user_trajectory.jsonl``: a persona User's exchanges."""
        return self.root / USER_TRAJECTORY

    def file(self, relative: PurePath) -> Path:
        """A file of the run folder named at run time by its path relative to the folder (a
        verifier's declared input, ``verifier/out.json``); no check that it stays inside: the
        caller's, where `relative` is not its own."""
        return self.root / relative

    def side_trajectory(self, side: str) -> Path:
        """A side trajectory by its key in `reroll.runfolder.run.SIDE_TRAJECTORIES`.

        Raises:
            KeyError: `side` is not one of them.
        """
        return self.root / SIDE_TRAJECTORIES[side]

    @property
    def asks(self) -> Path:
        """``asks.json``: the `reroll.runfolder.asks.AskLog`."""
        return self.root / ASKS_FILE

    @property
    def verifier(self) -> VerifierPaths:
        """``verifier/``: the verifier's output and logs."""
        return VerifierPaths(self.root / VERIFIER_DIR)

    @property
    def agent_log(self) -> Path:
        """``agent/output.log``: the agent's console output."""
        return self.root / AGENT_LOG

    @property
    def manifest(self) -> Path:
        """``workspace_manifest.json``: sha256 of every workspace file when the agent stopped."""
        return self.root / MANIFEST_FILE

    @property
    def error(self) -> Path:
        """``error.txt``: the traceback of a bug that ended the rollout."""
        return self.root / ERROR_FILE

    @property
    def limits(self) -> Path:
        """``limits.txt``: the task's limits lowered to what the host has."""
        return self.root / LIMITS_FILE

    @property
    def fidelity(self) -> Path:
        """``fidelity.json``: ``reroll replay``'s report."""
        return self.root / FIDELITY_FILE

    @property
    def services(self) -> Path:
        """``services/``: the environment's services' logs (not created)."""
        return self.root / SERVICES_DIR

    def service_log(self, name: str) -> Path:
        """``services/<name>.log``: one service's output."""
        return self.services / f"{name}.log"

    @property
    def services_record(self) -> Path:
        """``services/services.json``: the `reroll.runfolder.run.ServiceRecord` list."""
        return self.root / SERVICES_FILE

    @property
    def setup_log(self) -> Path:
        """``services/setup.log``: the environment's ``setup`` commands' output."""
        return self.services / SETUP_LOG

    @property
    def harness(self) -> Path:
        """``harness/``, as a path (not created: a reader's; a writer calls `make_harness` first)."""
        return self.root / HARNESS_DIR

    def make_harness(self) -> Path:
        """``harness/``, created if missing, mode 0700 (`reroll.runfolder.run.harness_folder`):
        what a writer of a file in it calls first.

        Raises:
            OSError: the folder cannot be created or its mode set.
        """
        return harness_folder(self.root)

    def harness_part(self, part: HarnessPart) -> Path:
        """``harness/<part>``: a side part's working folder (`reroll.runfolder.run.harness_part`).

        Raises:
            OSError: ``harness/`` cannot be created or its mode set.
        """
        return harness_part(self.root, part)

    @property
    def controller_log(self) -> Path:
        """``harness/controller.log``: the progress of a rollout started without a console."""
        return self.root / CONTROLLER_LOG

    @property
    def proxy_config(self) -> Path:
        """``harness/proxy.json``: the LLM proxy's config."""
        return self.root / PROXY_CONFIG

    @property
    def restored_checkpoint(self) -> Path:
        """``harness/restored-checkpoint.json``: the checkpoint a fork restored."""
        return self.harness / RESTORED_FILE

    @property
    def checkpoint_holds(self) -> Path:
        """``harness/checkpoint-holds.json``: how long each checkpointed step was held."""
        return self.harness / HELD_FILE

    @property
    def replayed_remainder(self) -> Path:
        """``harness/replayed-remainder.jsonl``: the exchanges a fork's proxy replays first."""
        return self.harness / REMAINDER_FILE

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/``: the checkpoints captured while it ran (not created)."""
        return self.root / CHECKPOINTS_DIR

    def checkpoint(self, step: int) -> CheckpointPaths:
        """``checkpoints/step-<step>/``: the checkpoint of `step` (not created)."""
        return CheckpointPaths(self.checkpoints / f"step-{step}")

    def checkpoint_steps(self) -> list[int]:
        """The steps of the ``checkpoints/step-K/`` folders present, sorted; none when there is no
        ``checkpoints/`` (complete or not: `reroll.rollout.layers.load_checkpoint` checks one)."""
        names = (folder.name.removeprefix("step-") for folder in self.checkpoints.glob("step-*"))
        return sorted(int(name) for name in names if name.isdigit())

    def beside(self, kind: Beside) -> Path:
        """The folder beside this run folder where `kind`'s runs go by default (``../continued``…)."""
        return self.root.parent / _BESIDE[kind]

    @property
    def tree_summary(self) -> Path:
        """``summary.json``: a branch tree's `reroll.runfolder.summary.BranchSummary`, when this run
        folder is a tree's parent (the shared prefix)."""
        return self.root / TREE_SUMMARY_FILE


@dataclass(frozen=True)
class JobPaths:
    """The paths of a job folder (`root`; the layout is `reroll.runfolder.folders`'s docstring)."""

    root: Path

    @property
    def spec(self) -> Path:
        """``job.json``: the resolved `reroll.jobs.jobfile.JobSpec`."""
        return self.root / JOB_SPEC_FILE

    def run(self, name: str) -> RunPaths:
        """``<name>/``: the run folder of the job's rollout `name` (not created)."""
        return RunPaths(self.root / name)

    @property
    def summary(self) -> Path:
        """``summary.json``: the `reroll.runfolder.summary.JobSummary`."""
        return self.root / JOB_SUMMARY_FILE

    @property
    def attempts(self) -> Path:
        """``_attempts/``: the folders of failed attempts (not created)."""
        return self.root / ATTEMPTS_DIR

    @property
    def continued(self) -> JobPaths:
        """``continued/``: ``reroll continue-job``'s continuations, a job folder of its own."""
        return JobPaths(self.root / CONTINUED_DIR)

    @property
    def store(self) -> Path:
        """``store/``: a ``sequential-shared`` job's learner store (`reroll.runfolder.store`)."""
        return self.root / STORE_DIR
