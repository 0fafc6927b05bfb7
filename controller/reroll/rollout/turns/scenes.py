"""The turn scheduler: runs a trial's scenes, turns and User rounds in one sandbox (`run_trial`).

For each scene in order (the agent's processes stopped between two scenes), each turn — or, in a
scene a User drives, each round until the User returns None or ``max_rounds`` — it tells the
proxy the turn's `Place` (every exchange records it), picks the prompt, runs the role's agent
through the rollout's `TurnRunner` and records the turn in ``trial.json`` and the prompt in
``prompts.json`` (every prompt sent, in order) before the next begins. The prompt is:

- in a continuation, for the turns the checkpoint covers (`TrialContext.recorded`), the one the
  original sent — the User is not called for them;
- else a User's ``run`` (a User scene), or the turn's ``prompt`` (None: the task's instruction),
  followed by the messages other roles left for it in the outbox.

After each turn of a scene with several roles the outbox (``<workspace>/.outbox/<role>.json``)
is read, as the agent's user (so a planted symlink reaches nothing the agent could not read
itself), and emptied. After each round of a User scene a soft verify (the rollout's verifier,
`reroll.rollout.verify.verifiers.Verifier.verify` with ``soft``) scores the workspace for the User's
`RoundResult`. A scene's ``persona`` is a User played by a model, opened for the scene
(`reroll.rollout.turns.persona`). While a turn runs, the agent's ask_user questions are answered
(by the scene's User: `reroll.rollout.turns.asks`). The first turn that does not end well (a
timeout, an agent error, a proxy stop) ends the trial: its outcome is the rollout's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from reroll_contracts.errors import RunFolderError, TrialError
from reroll_contracts.proxy import ProxyStatus
from reroll_contracts.trajectory import Place, load_trajectory
from rich.console import Console

from reroll.agents import AgentSpec
from reroll.host.llm_proxy import LlmProxy
from reroll.rollout.turns.asks import Answerer, answering
from reroll.rollout.turns.persona import PersonaPlan, PersonaUser, open_persona
from reroll.rollout.verify.script_verifier import quiesce
from reroll.rollout.verify.verifiers import Verifier, VerifyRequest
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import write_json
from reroll.runfolder.trial import TrialRecord, TurnRecord
from reroll.sandbox.base import Sandbox
from reroll.tasks.task import Task
from reroll.trials.config import OUTBOX, PromptSource, Scene, TrialConfig, Turn, TurnStatus
from reroll.trials.users import BaseUser, RoundResult, call_setup, load_user, next_prompt

OUTBOX_READ_TIMEOUT_SECONDS = 30.0
MAX_OUTBOX_MESSAGE_BYTES = 64 * 1024
"""The most of one outbox file put into a prompt."""


@dataclass
class AgentOutcome:
    """How an agent's turn ended."""

    exit_code: int | None = None
    """The agent's exit code; None when it timed out or the controller stopped it."""
    timed_out: bool = False
    status: ProxyStatus = field(default_factory=ProxyStatus)
    """The proxy's status once the agent is gone; ``status.stop`` is set when the proxy refused
    every request from some point on (replay-only cut point, strict divergence)."""
    output_tail: str = ""
    """The last lines of the agent's output (stdout and stderr), for the error of a failed agent."""

    @property
    def ended_well(self) -> bool:
        """The agent exited 0 on its own."""
        return self.exit_code == 0 and not self.timed_out and self.status.stop is None

    @property
    def status_word(self) -> TurnStatus:
        """The turn's ``TurnRecord.status``."""
        if self.status.stop is not None:
            return "stopped"
        return "timeout" if self.timed_out else "ok" if self.exit_code == 0 else "error"


TurnRunner = Callable[[AgentSpec, str, bool], Awaitable[AgentOutcome]]
"""Runs one turn: ``(agent, prompt, resume)`` → how it ended (`reroll.rollout.agent_phase.run_agent`)."""


class SceneHook(Protocol):
    """What the scheduler asks of the rollout at each scene (the skills it sees:
    `reroll.rollout.skills.SceneSkills`)."""

    async def enter(self, scene: Scene, index: int) -> None:
        """Prepare `scene` (the `index`-th) before its first turn."""
        ...

    def prompt(self, agent: AgentSpec, prompt: str) -> str:
        """The prompt `agent` is told for `prompt` in a new session (a nudge may come before it)."""
        ...


@dataclass
class TrialContext:
    """What the scheduler needs of the rollout."""

    trial: TrialConfig
    """The trial, resolved (every role has its agent)."""
    agents: dict[str, AgentSpec]
    """The trial's agents by name."""
    task: Task
    sandbox: Sandbox
    env: dict[str, str]
    """The base environment of sandbox processes."""
    run_dir: Path
    proxy: LlmProxy | None
    run_turn: TurnRunner
    verifier: Verifier
    """Scores the workspace after each round of a User scene (a soft verify)."""
    verify_request: VerifyRequest
    """The rollout's final verify request; a round's is this one with its own output folder and
    ``soft`` (same sandbox, environment and judge settings)."""
    recorded: list[TurnRecord] = field(default_factory=list)
    """A continuation's turns whose prompts are re-sent as recorded (the first ones)."""
    record: TrialRecord = field(default_factory=TrialRecord)
    """What ran so far (written to ``trial.json`` after each turn)."""
    hook: SceneHook | None = None
    """Called as each scene begins and for each new session's prompt (not for a recorded or resumed turn)."""
    asks: Answerer | None = None
    """Answers the agent's ask_user questions during each turn (`reroll.rollout.turns.asks`); None: the
    rollout does not offer the tool."""
    persona: PersonaPlan = field(default_factory=PersonaPlan)
    """How a persona scene opens its model (`reroll.rollout.turns.persona`)."""


async def run_trial(ctx: TrialContext, console: Console) -> AgentOutcome:
    """Run every scene of `ctx.trial` (see the module docstring).

    Returns:
        The last turn's outcome: the first that did not end well, else the last one.

    Raises:
        TrialError: a User cannot be loaded.
        UserCallbackError: a User's callback raised or returned a non-string.
        ModelError: a persona's model cannot be used.
        RunFolderError: a recorded turn's place is not the one this trial reaches (a changed trial).
        SandboxError, InfrastructureError: the sandbox or the proxy failed.
    """
    outcome = AgentOutcome(exit_code=0)
    _write_record(ctx)
    for index, scene in enumerate(ctx.trial.scenes):
        if index > 0:
            await quiesce(ctx.sandbox)  # the previous scene's agent processes are gone
        if ctx.hook is not None:
            await ctx.hook.enter(scene, index)
        run = _run_rounds if scene.driven else _run_turns
        outcome = await run(ctx, scene, console)
        if not outcome.ended_well:
            break
    return outcome


async def _run_turns(ctx: TrialContext, scene: Scene, console: Console) -> AgentOutcome:
    outcome = AgentOutcome(exit_code=0)
    inbox: dict[str, list[str]] = {}
    for turn in scene.turns:
        base = turn.prompt if turn.prompt is not None else ctx.task.instruction
        source: PromptSource = "trial" if turn.prompt is not None else "instruction"
        prompt = with_messages(base, inbox.pop(turn.role, []))
        outcome = await _turn(ctx, scene, turn, prompt, source, None, None, console)
        if not outcome.ended_well:
            break
        if len(scene.roles) > 1:
            for recipient, message in await read_outbox(ctx.sandbox, ctx.env):
                inbox.setdefault(recipient, []).append(f"From {turn.role}: {message}")
    return outcome


async def _run_rounds(ctx: TrialContext, scene: Scene, console: Console) -> AgentOutcome:
    async with contextlib.AsyncExitStack() as stack:
        if scene.persona is not None:
            user: BaseUser = await stack.enter_async_context(
                open_persona(scene.persona, ctx.persona, ctx.run_dir)
            )
        else:
            assert scene.user is not None
            user = load_user(scene.user)
        return await _rounds(ctx, scene, user, console)


async def _rounds(ctx: TrialContext, scene: Scene, user: BaseUser, console: Console) -> AgentOutcome:
    solution = ctx.task.solution_dir / "solve.sh" if ctx.task.solution_dir else None
    await call_setup(
        user, ctx.task.instruction, solution.read_text() if solution and solution.is_file() else None
    )
    outcome = AgentOutcome(exit_code=0)
    result: RoundResult | None = None
    turn = Turn(scene.roles[0].name)
    persona = user if isinstance(user, PersonaUser) else None
    for round_index in range(scene.max_rounds):
        prompt: str | None = None
        position, made = len(ctx.record.turns), persona.exchanges if persona else 0
        if position >= len(ctx.recorded):  # live from the cut: the User decides
            prompt = await next_prompt(user, round_index, ctx.task.instruction, result)
            if prompt is None:
                console.print(f"[dim]scene {scene.name}: the User ended it after {round_index} rounds[/dim]")
                ctx.record.user_stopped.append(scene.name)
                _write_record(ctx)
                break
        elif persona is not None and ctx.recorded[position].user_exchange is not None:
            # its model wrote the recorded prompt: served again, so its conversation goes on
            await next_prompt(persona, round_index, ctx.task.instruction, result)
        exchange = persona.exchanges - 1 if persona is not None and persona.exchanges > made else None
        outcome = await _turn(ctx, scene, turn, prompt or "", "user", round_index, user, console, exchange)
        if not outcome.ended_well or round_index == scene.max_rounds - 1:
            break
        result = await _round_result(ctx, round_index, outcome)
    return outcome


async def _turn(
    ctx: TrialContext,
    scene: Scene,
    turn: Turn,
    prompt: str,
    source: PromptSource,
    round_index: int | None,
    user: BaseUser | None,
    console: Console,
    user_exchange: int | None = None,
) -> AgentOutcome:
    """Run one turn: its place to the proxy, the prompt (the recorded one in a continuation's
    replayed part), the agent (its ask_user questions answered by `user`, if any), then its record
    (`user_exchange`: the persona's exchange that wrote the prompt, if one did)."""
    position = len(ctx.record.turns)
    place = Place(turn=position, scene=scene.name, role=turn.role, round=round_index)
    if position < len(ctx.recorded):
        recorded = ctx.recorded[position]
        if (recorded.place.scene, recorded.place.role) != (place.scene, place.role):
            raise RunFolderError(
                f"recorded turn {position} is {recorded.place.scene}/{recorded.place.role}, "
                f"but the trial reaches {place.scene}/{place.role} there"
            )
        prompt, source = recorded.prompt, "branch" if recorded.prompt_source == "branch" else "recorded"
    agent = ctx.agents[scene.role(turn.role).agent or ""]
    if ctx.hook is not None and source != "recorded" and not turn.resume:
        prompt = ctx.hook.prompt(agent, prompt)
    if ctx.proxy is not None:
        await ctx.proxy.set_place(place)
    where = f"round {round_index}" if round_index is not None else f"turn {position}"
    console.print(
        f"[dim]scene {scene.name}, {where}: {turn.role} ({agent.name}{', resumed' * turn.resume})[/dim]"
    )
    _write_prompts(ctx, prompt)
    outcome = await answering(ctx.run_turn(agent, prompt, turn.resume), ctx.asks, ctx.proxy, user, console)
    ctx.record.turns.append(
        TurnRecord(
            place=place,
            prompt=prompt,
            prompt_source=source,
            resume=turn.resume,
            status=outcome.status_word,
            exit_code=outcome.exit_code,
            user_exchange=user_exchange,
        )
    )
    _write_record(ctx)
    return outcome


async def _round_result(ctx: TrialContext, round_index: int, outcome: AgentOutcome) -> RoundResult:
    """Soft-verify the workspace after a round; its result (also put into the round's record)."""
    turn = len(ctx.record.turns) - 1
    output_dir = RunPaths(ctx.run_dir).verifier.round(turn).root
    request = dataclasses.replace(ctx.verify_request, output_dir=output_dir, soft=True)
    verdict = await ctx.verifier.verify(request)
    rewards = verdict.rewards if verdict.status == "ok" else None
    error = verdict.error if verdict.status != "ok" else None
    record = ctx.record.turns[turn]
    ctx.record.turns[turn] = record.model_copy(update={"rewards": rewards, "verifier_error": error})
    _write_record(ctx)
    exchanges = []
    with contextlib.suppress(FileNotFoundError):
        exchanges = [
            exchange
            for exchange in load_trajectory(RunPaths(ctx.run_dir).trajectory).exchanges
            if exchange.metadata.place is not None and exchange.metadata.place.turn == turn
        ]
    return RoundResult(
        round=round_index,
        prompt=record.prompt,
        trajectory=exchanges,
        rewards=rewards,
        verifier_output=verdict.output,
        verifier_error=error,
        exit_code=outcome.exit_code,
    )


def with_messages(prompt: str, messages: list[str]) -> str:
    """`prompt` followed by the outbox `messages` for its role, if any."""
    if not messages:
        return prompt
    return prompt + "\n\nMessages for you from the other roles:\n" + "\n".join(f"- {m}" for m in messages)


_READ_OUTBOX = r"""
cd "$1" 2>/dev/null || exit 0
for file in *.json; do
  if [ -f "$file" ] && [ ! -L "$file" ]; then
    printf '%s\0' "${file%.json}"; head -c "$2" -- "$file"; printf '\0'
  fi
  rm -f -- "$file"
done
"""


async def read_outbox(sandbox: Sandbox, env: dict[str, str]) -> list[tuple[str, str]]:
    """Read and empty the outbox: (recipient, message) per ``<recipient>.json`` file.

    Run as the agent's user, with a time limit: a symlink is skipped (and a link the agent
    could follow reaches nothing it could not read itself), a FIFO cannot block it. A file
    holding ``{"content": ...}`` gives its content; any other text is taken as it is.
    """
    folder = f"{sandbox.layout.workspace}/{OUTBOX}"
    done = await sandbox.exec(
        ["sh", "-c", _READ_OUTBOX, "read-outbox", folder, str(MAX_OUTBOX_MESSAGE_BYTES)],
        env=env,
        inherit_env=False,
        user=sandbox.layout.agent_user,
        timeout_seconds=OUTBOX_READ_TIMEOUT_SECONDS,
    )
    fields = done.stdout.split(b"\0")
    messages = []
    for name, raw in zip(fields[0::2], fields[1::2], strict=False):
        text = raw.decode(errors="replace")
        with contextlib.suppress(ValueError):
            parsed = json.loads(text)
            if isinstance(parsed, dict) and isinstance(parsed.get("content"), str):
                text = parsed["content"]
        messages.append((name.decode(errors="replace"), text.strip()))
    return messages


def _write_prompts(ctx: TrialContext, prompt: str) -> None:
    prompts = [turn.prompt for turn in ctx.record.turns] + [prompt]
    write_json(RunPaths(ctx.run_dir).prompts, prompts)


def _write_record(ctx: TrialContext) -> None:
    write_json(RunPaths(ctx.run_dir).trial, ctx.record)


def check_trial(trial: TrialConfig, agents: dict[str, AgentSpec]) -> None:
    """Refuse, before anything runs, a trial that cannot run: a User that cannot be loaded, a
    session resumed on an agent that has none.

    Raises:
        TrialError: a scene's User cannot be loaded (`reroll.trials.users.load_user`), or a ``resume``
            turn's agent declares no ``resume`` command.
    """
    for scene in trial.scenes:
        if scene.user is not None:
            load_user(scene.user)
        for index, turn in enumerate(scene.turns):
            agent = agents[scene.role(turn.role).agent or ""]
            if turn.resume and agent.resume is None:
                raise TrialError(
                    f"scene {scene.name!r}, turn {index}: resume: {turn.role!r} runs {agent.name}, which "
                    "has no session to resume (no `resume` command in its declaration); use a new "
                    "session or an agent with one (claude-code, codex)"
                )
