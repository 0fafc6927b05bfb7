"""ask_user as a rollout extension: reroll's ``ask_user`` tool offered over MCP to every agent
that calls a model, its questions answered during each turn (by the scene's User, the recording,
a branch's answer: `reroll.rollout.turns.asks`)."""

from __future__ import annotations

from reroll_contracts.errors import AgentError

from reroll.agents import AgentSpec
from reroll.rollout.hooks import Draft, Extension, Run, TurnLaunch
from reroll.rollout.origin import FromCheckpoint
from reroll.rollout.turns.asks import Answerer, offer_ask_user
from reroll.runfolder.asks import AskRecord
from reroll.runfolder.run import BranchedFrom


class AskUser(Extension):
    """Option read: config.json's ``ask_user`` (`reroll.settings.RolloutSettings.ask_user`)."""

    def __init__(self) -> None:
        self.recorded: list[AskRecord] = []
        self.branch_answer: str | None = None

    def configure(self, draft: Draft) -> None:
        """Refuse the tool to agents without an MCP client; keep a replayed run's recorded answers.

        Raises:
            AgentError: an agent of the rollout calls a model but has no MCP client.
        """
        if not draft.config.ask_user:
            return
        check_ask_user(draft.agents)
        origin = draft.origin
        if isinstance(origin, FromCheckpoint) and origin.layers is None:
            self.recorded = origin.checkpoint.recorded_asks
            provenance = origin.provenance
            self.branch_answer = provenance.answer if isinstance(provenance, BranchedFrom) else None

    async def before_agent(self, run: Run) -> None:
        """Give the scheduler the answerer of the rollout's questions."""
        assert run.trial is not None
        if run.plan.config.ask_user:
            run.trial.asks = Answerer(run.plan.run_dir, self.recorded, self.branch_answer)

    async def before_turn(self, run: Run, launch: TurnLaunch) -> None:
        """Offer the tool's MCP server to an agent that calls a model."""
        offered = run.trial is not None and run.trial.asks is not None
        if offered and run.proxy is not None and launch.agent.api_format != "none":
            launch.mcp_servers.append(await offer_ask_user(run.sandbox, run.proxy))


def check_ask_user(agents: dict[str, AgentSpec]) -> None:
    """Refuse ask_user to a rollout with an agent that has no MCP client (the tool is offered over MCP).

    Raises:
        AgentError: one of `agents` calls a model but has no MCP client.
    """
    without = [name for name, agent in agents.items() if agent.mcp is None and agent.api_format != "none"]
    if without:
        raise AgentError(
            f"--ask-user: the ask_user tool is offered over MCP, and {', '.join(without)} has no MCP client; "
            "use an agent that has one (claude-code, codex, openhands)"
        )
