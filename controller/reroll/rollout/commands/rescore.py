"""``reroll rescore RUN_FOLDER``: score a recorded run again, reproducibly or with another judge.

The workspace is rebuilt as ``reroll replay`` rebuilds it (a fresh sandbox, every recorded agent
exchange served in order, no live model: `reroll.rollout.start.start_rollout` from the whole
recording, replay only), then the task's verifier runs again. An LLM judge
(`reroll.rollout.verify.judge`) then serves the original's recorded answers
(``trajectory/judge_trajectory.jsonl``) through its proxy in replay mode: the same requests get
the same answers, so the reward is the same, byte for byte; a request that differs from the
recorded one (the rebuilt workspace is not the original's) is served anyway and reported as a
divergence, as for an agent. With a judge model, the judge asks it live instead (and records
its answers in the new folder). config.json's ``rescored_from`` names the original and the judge.
"""

from __future__ import annotations

from pathlib import Path

from reroll_contracts.errors import RunFolderError
from rich.console import Console

from reroll.rollout.checkpoint import open_checkpoint
from reroll.rollout.start import FromCheckpoint, RolloutOutcome, start_rollout
from reroll.rollout.verify.judge_model import judge_flag
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import RescoredFrom
from reroll.settings import RolloutSettings
from reroll.tasks.spec import JUDGED_TYPES


async def rescore_run(
    run_folder: Path,
    *,
    judge_model: str | None = None,
    tasks_dir: Path | None = None,
    options: RolloutSettings = RolloutSettings(),
    output: Path | None = None,
    console: Console | None = None,
) -> RolloutOutcome:
    """Rebuild `run_folder` by replay and run its verifier again (see the module docstring).

    Args:
        run_folder: the recorded run.
        judge_model: the judge model to ask live; None: replay the recorded judge answers.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        options: how the rebuild runs (sandbox, network [default: the original's]).
        output: jobs dir of the new run folder [default: ``<original's parent>/rescored``].
        console: where progress goes [default: ``harness/controller.log`` in the new folder].

    Returns:
        The new run folder and its result (``rewards``, ``verify_result``).

    Raises:
        RunFolderError: the folder is missing or corrupt, or it holds no judge trajectory to
            replay (and no `judge_model` is given).
        ModelError: `judge_model` cannot be used (an unknown provider, a missing key or script).
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
        Nothing is written when any of these is raised.
    """
    checkpoint = open_checkpoint(run_folder, tasks_dir=tasks_dir, console=console)
    original = checkpoint.original
    if judge_model is not None:  # a scripted:PATH stored absolute, as config.json's judge_model
        judge_model = judge_flag(judge_model, checkpoint.task)
    judge_trajectory = RunPaths(original.path).judge_trajectory
    recorded = judge_trajectory.is_file()
    if judge_model is None and checkpoint.task.spec.verifier.type in JUDGED_TYPES and not recorded:
        raise RunFolderError(
            f"{judge_trajectory}: missing, no judge answers to replay; pass --judge-model to ask a judge live"
        )
    return await start_rollout(
        FromCheckpoint(checkpoint, checkpoint.continued_from(None, replay_only=True)),
        live_model=None,
        parent=output or RunPaths(original.path).beside("rescored"),
        name=original.path.name,
        options=options.model_copy(update={"judge_model": judge_model}),
        console=console,
        rescored_from=RescoredFrom(path=str(original.path), judge_model=judge_model),
    )
