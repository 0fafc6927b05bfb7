"""``reroll branch``: N continuations per model from a checkpoint of a run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from reroll.cli.common import (
    ExecutorOption,
    MaxRetriesOption,
    MaxStartingOption,
    RayAddressOption,
    TasksDirOption,
    console,
    guarded,
    runner_options,
)
from reroll.cli.flags import (
    FaultSeedOption,
    FaultsOption,
    ImageMapOption,
    MaxStepsOption,
    NetworkOption,
    OnDivergenceOption,
    SandboxConfigOption,
    SandboxOption,
    SkillsDirOption,
    SkillsOption,
    StrictDivergenceOption,
    TimeoutOption,
    TrustOption,
    UserModelOption,
    rollout_settings,
)
from reroll.runfolder.summary import Via

if TYPE_CHECKING:
    from reroll.runfolder.summary import BranchSummary

BranchAtOption = Annotated[
    str | None,
    typer.Option(
        help="Checkpoint: replay this many exchanges (0..N), a fraction of them (e.g. 0.5), or in a "
        "trial TURN:STEP (at a round boundary: TURN:0); several separated by commas (10,20,30) "
        "give the value at each: a value curve along the run."
    ),
]
EveryOption = Annotated[
    int | None,
    typer.Option(min=1, help="Instead of --at: a cut point every N exchanges, from 0 to the run's end."),
]
PromptOption = Annotated[
    list[str] | None,
    typer.Option(
        "--prompt",
        help="Give the turn the cut starts (--at TURN:0) this prompt instead of the recorded one; "
        "repeat for more: one group of branches per prompt.",
    ),
]
AtAskOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Instead of --at: the run's ask_user question N (0-based, asks.json); one group of branches "
        "per option it offered (or per --answer), cut where it was asked.",
    ),
]
AnswerOption = Annotated[
    list[str] | None,
    typer.Option("--answer", help="With --at-ask: give this answer instead of the options; repeat for more."),
]
ViaOption = Annotated[
    Via | None,
    typer.Option(
        help="How branches reach step K: snapshot (the prefix rebuilt once, its environment state, "
        "workspace and agent session forked into each branch) or replay (each branch re-executes the "
        "prefix) [default: snapshot where the agent has a resumable session, else replay]."
    ),
]


def branch(
    run_folder: Annotated[Path, typer.Argument(help="The run folder to branch.")],
    model: Annotated[
        list[str], typer.Option("--model", help="Live model of a group of branches; repeat for more models.")
    ],
    at: BranchAtOption = None,
    every: EveryOption = None,
    prompt: PromptOption = None,
    at_ask: AtAskOption = None,
    answer: AnswerOption = None,
    n: Annotated[int, typer.Option("-n", "--n", min=1, help="Branches per model and branch point.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Most branches running at once.")] = 4,
    max_retries: MaxRetriesOption = None,
    executor: ExecutorOption = None,
    max_starting: MaxStartingOption = None,
    ray_address: RayAddressOption = None,
    tasks_dir: TasksDirOption = None,
    timeout: TimeoutOption = None,
    max_steps: MaxStepsOption = None,
    output: Annotated[
        Path | None, typer.Option(help="Where the tree goes [default: <orig-parent>/branched].")
    ] = None,
    on_divergence: OnDivergenceOption = None,
    strict_divergence: StrictDivergenceOption = False,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    image_map: ImageMapOption = None,
    network: NetworkOption = None,
    trust: TrustOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    skills: SkillsOption = None,
    skills_dir: SkillsDirOption = None,
    user_model: UserModelOption = None,
    via: ViaOption = None,
) -> None:
    """Branch a run: N continuations per model from checkpoint --at K, concurrently, each verified.

    Several checkpoints (--at 10,20,30, --every N) estimate the value at each: a value curve
    along the run. --prompt TEXT (repeated) varies the prompt of the turn the cut starts; --at-ask N
    gives each option of the run's ask_user question N (or each --answer) to its own branches.

    Branches run like a job's rollouts (executor, start gate, retries of infrastructure
    failures). Prints each branch's reward and the mean reward per model (the value estimate of the
    checkpoint state). The sandbox, its settings and the network are the original's unless
    given. Says which way (--via) the branches reached step K. Exit 1 when a branch ended in error.
    """
    summary = guarded(_branched(dict(locals())))
    from reroll.cli.reports import branch_report

    console.print(branch_report(summary))
    if any(child.status == "error" for child in summary.children):
        raise typer.Exit(1)


async def _branched(flags: dict[str, Any]) -> BranchSummary:
    """Run the tree of ``branch``'s `flags` (its parameters by name).

    Where the branches run in this process (the ``asyncio`` executor, the default), the shared
    LLM proxy they join (the scripted model's server too) is started first, so that its start (a
    second of imports) overlaps this command's own imports and checks rather than following them;
    a command that stops before its branches run stops it with its event loop.

    Raises:
        typer.Exit: a flag is invalid (code 2).
        RerollError: the branch was refused or failed (`guarded` reports it).
    """
    if flags["executor"] in (None, "asyncio"):
        from reroll.host.shared_process import prestart_proxy

        await prestart_proxy()
    options = rollout_settings(flags)
    names = ("concurrency", "max_starting", "executor", "ray_address", "max_retries")
    runner = runner_options(*(flags[name] for name in names))
    from reroll.jobs.branch import branch as branch_run

    return await branch_run(
        flags["run_folder"],
        at=flags["at"],
        models=flags["model"],
        n=flags["n"],
        every=flags["every"],
        prompts=flags["prompt"] or (),
        at_ask=flags["at_ask"],
        answers=flags["answer"] or (),
        tasks_dir=flags["tasks_dir"],
        options=options,
        runner=runner,
        output=flags["output"],
        console=console,
        via=flags["via"],
    )
