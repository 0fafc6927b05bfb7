"""The MCP configuration the services extension writes for a launch: a stdio server with a tool
filter the agent's configuration cannot say is started behind reroll's filter, copied beside it
(a stand-in sandbox that keeps the files written); ``--without-mcp`` withholds the task's servers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from reroll.agents import get_agent
from reroll.rollout.extensions.services import ServicesAndMcp, _offer_mcp
from reroll.rollout.hooks import Draft, TurnLaunch
from reroll.rollout.mcp import FILTER_SOURCE, MCP_CONFIG_ENV
from reroll.rollout.start import NewRecording, check_rollout
from reroll.runfolder.run import RunConfig, RunResult
from reroll.settings import RolloutSettings, continuation_settings, recorded_settings
from reroll.tasks.task import load_task
from reroll.trials.config import TrialConfig
from rich.console import Console

FILTERED_TASK = Path(__file__).parents[2] / "fixtures" / "benchflow-mcp-filters"


class Files:
    """A sandbox that only keeps what is written into it."""

    def __init__(self) -> None:
        self.layout = SimpleNamespace(logs_dir="/logs")
        self.files: dict[str, bytes] = {}

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> int:
        self.files[path] = data
        return len(data)


async def offer(agent: str) -> tuple[dict[str, str], Files]:
    mail, _ = load_task(FILTERED_TASK).spec.environment.mcp_servers  # the stdio one
    sandbox = Files()
    sandbox_any: Any = sandbox
    env = await _offer_mcp(sandbox_any, get_agent(agent), [mail], Console(quiet=True))
    return env, sandbox


async def test_claude_code_reaches_a_filtered_server_through_reroll_s_filter() -> None:
    env, sandbox = await offer("claude-code")
    assert env == {MCP_CONFIG_ENV: "/logs/agent/mcp/mcp.json"}
    assert sandbox.files["/logs/agent/mcp/mcp_filter.py"] == FILTER_SOURCE.read_bytes()
    entry = json.loads(sandbox.files["/logs/agent/mcp/mcp.json"])["mcpServers"]["mail"]
    assert entry["args"][0] == "/logs/agent/mcp/mcp_filter.py"
    assert entry["args"][2:] == ["python3", "/app/mail_mcp.py"]


async def test_no_filter_copied_when_the_configuration_says_every_filter() -> None:
    mail, _ = load_task(FILTERED_TASK).spec.environment.mcp_servers
    plain = mail.model_copy(update={"include_tags": None, "exclude_tags": None})
    sandbox = Files()
    sandbox_any: Any = sandbox
    await _offer_mcp(sandbox_any, get_agent("codex"), [plain], Console(quiet=True))
    assert list(sandbox.files) == ["/logs/agent/mcp/config.toml"]  # enabled_tools says `tools`


MAIL_TASK = Path(__file__).parents[3] / "examples" / "tasks" / "mail-calendar"


def planned(agent: str, without_mcp: bool) -> tuple[ServicesAndMcp, Any]:
    """The services extension configured for `agent` on mail-calendar (its stdio ``mail`` MCP
    server), and a stand-in `Run` of it (the task, result.json, a sandbox that keeps files)."""
    task, spec = load_task(MAIL_TASK), get_agent(agent)
    config = RunConfig(task_path=str(task.path), agent=agent, without_mcp=without_mcp)
    settings = RolloutSettings(without_mcp=without_mcp)
    draft = Draft(
        NewRecording(task, spec), settings, settings, task, TrialConfig.single(), {agent: spec}, config
    )
    extension = ServicesAndMcp()
    extension.configure(draft)
    run = SimpleNamespace(plan=SimpleNamespace(task=task), result=RunResult(), console=Console(quiet=True))
    run.sandbox = Files()
    return extension, run


async def test_without_mcp_a_baseline_agent_runs_an_mcp_task_without_its_servers() -> None:
    """An agent with no MCP client runs the task through reroll's bridge (no refusal); with
    --without-mcp it runs, every agent offered none of the task's servers, and result.json names
    them (``mcp_withheld``)."""
    origin = NewRecording(load_task(MAIL_TASK), get_agent("mini-swe-agent"))
    check_rollout(origin, live_model=None, options=RolloutSettings())
    check_rollout(origin, live_model=None, options=RolloutSettings(without_mcp=True))
    for agent in ("mini-swe-agent", "claude-code"):
        extension, run = planned(agent, without_mcp=True)
        launch = TurnLaunch(get_agent(agent), {}, resume=False)
        await extension.before_turn(run, launch)
        await extension.before_agent(run)
        assert launch.env == {} and run.sandbox.files == {}
        assert run.result.mcp_withheld == ["mail"]
    extension, run = planned("claude-code", without_mcp=False)  # the same agent offered them
    launch = TurnLaunch(get_agent("claude-code"), {}, resume=False)
    await extension.before_turn(run, launch)
    await extension.before_agent(run)
    assert launch.env == {MCP_CONFIG_ENV: "/logs/agent/mcp/mcp.json"} and run.result.mcp_withheld is None


def test_without_mcp_is_recorded_and_carried_to_continuations() -> None:
    """config.json's ``without_mcp`` is what a continuation or branch inherits (`Carry.OVERRIDABLE`)."""
    config = RunConfig(task_path="/t", agent="mini-swe-agent", without_mcp=True)
    assert continuation_settings(recorded_settings(config), RolloutSettings()).without_mcp is True
    assert RunConfig.model_validate_json(config.model_dump_json()).without_mcp is True


class HostFolder(Files):
    """A sandbox whose files are real ones of a host folder and whose commands run on the host
    (the bridge is run for real; the layout's paths are under the folder)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.layout = SimpleNamespace(
            logs_dir=str(root / "logs"), agents_dir=str(root / "agents"), workspace=str(root), agent_user=""
        )

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> int:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
        Path(path).chmod(mode)
        return await super().put_file(path, data, mode)

    async def exec(self, argv: list[str], **options: Any) -> Any:
        env = options["env"]
        done = subprocess.run(argv, env=env, cwd=options["cwd"], capture_output=True, timeout=60)
        return SimpleNamespace(exit_code=done.returncode, stdout=done.stdout)


@pytest.mark.spawns
async def test_an_agent_without_mcp_gets_the_bridge_on_its_path_and_the_tools_in_a_note(
    tmp_path: Path,
) -> None:
    """mini-swe-agent on mail-calendar: bridge.json, the bridge, the filter and ``mcp-call``
    written beside each other, ``mcp-call``'s folder first on PATH, and the note names the
    ``mail`` server's tools as the bridge listed them (its stdio server started for real)."""
    extension, run = planned("mini-swe-agent", without_mcp=False)
    (mail,) = run.plan.task.spec.environment.mcp_servers
    server = MAIL_TASK / "environment" / "workspace" / ".services" / "mail" / "mcp_server.py"
    moved = mail.model_copy(update={"command": "/usr/bin/python3", "args": [str(server)]})
    run.plan.task.spec.environment.mcp_servers[0] = moved
    run.sandbox = HostFolder(tmp_path)
    launch = TurnLaunch(get_agent("mini-swe-agent"), {"PATH": "/usr/bin:/bin"}, resume=False)
    await extension.before_turn(run, launch)
    folder = tmp_path / "logs" / "agent" / "mcp"
    assert launch.env[MCP_CONFIG_ENV] == str(folder / "bridge.json")
    assert launch.env["PATH"] == f"{folder / 'bin'}:/usr/bin:/bin"
    assert sorted(p.name for p in folder.iterdir()) == [
        "bin",
        "bridge.json",
        "mcp_bridge.py",
        "mcp_filter.py",
    ]
    (note,) = launch.notes
    assert "Server `mail`:\n    list_messages: List the messages of a mail folder" in note
    assert "book_event: Book a calendar event" in note
    later = TurnLaunch(get_agent("mini-swe-agent"), {"PATH": "/usr/bin"}, resume=True)
    await extension.before_turn(run, later)
    assert later.notes == [] and later.env["PATH"].startswith(str(folder / "bin"))  # told once
