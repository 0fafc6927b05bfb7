"""Red team, issue 19 items 6 and 5 (harness files): the controller's channel to the LLM proxy
is the controller's, and one rollout cannot take another's proxy address and token.

Before: the proxy's ``/_reroll/*`` endpoints took the agent's own token, so an agent POSTed
``/_reroll/place`` and the recording's ``metadata.place`` said turn 7, role "reviewer" in a
one-agent run; and ``harness/proxy.json`` (address + rollout token) was world-readable, so with
``--network full`` an agent of rollout A read rollout B's and injected a step into B's recording.

The tests run the real proxy (`reroll.host.llm_proxy.LlmProxy`, a subprocess) in front of the real
scripted model, a real unprivileged process, and one real rollout with a malicious agent.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from reroll.host.llm_proxy import LlmProxy
from reroll.models.spec import ModelSpec, live_upstream
from reroll.runfolder.run import PROXY_CONFIG, TRAJECTORY, create_run_folder, harness_folder
from reroll_contracts.trajectory import Place

from tests.e2e.test_reward_hacks import write_files

pytestmark = pytest.mark.spawns  # the real proxy and scripted model processes
REROLL = str(Path(sys.executable).parent / "reroll")
FORGED = {"turn": 7, "scene": "main", "role": "reviewer", "round": 7}
"""The place an agent would like its exchanges to be recorded at."""
UNPRIVILEGED = 65534
"""``nobody``: a uid like the sandbox's agent user, which owns nothing of the controller's."""


async def post(url: str, token: str, body: dict[str, Any]) -> int:
    """POST `body` as a plain HTTP client holding `token` (``Authorization: Bearer``); the status."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response,
    ):
        return response.status


def chat(proxy: LlmProxy) -> str:
    return proxy.base_url + "/chat/completions"


def controller_url(proxy: LlmProxy, path: str) -> str:
    return proxy.base_url.removesuffix("/v1") + path


HELLO = {"model": "scripted", "messages": [{"role": "user", "content": "go"}]}


def recorded_places(run_dir: Path) -> list[Any]:
    trajectory = run_dir / TRAJECTORY
    lines = trajectory.read_text().splitlines() if trajectory.exists() else []
    return [json.loads(line)["metadata"]["place"] for line in lines]


@pytest.fixture
def jobs_dir() -> Iterator[Path]:
    """A jobs folder every user may enter, as a shared one is (pytest's own tmp_path is not)."""
    with tempfile.TemporaryDirectory(prefix="reroll-test-jobs-") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


@pytest.fixture
async def two_rollouts(
    tmp_path: Path, jobs_dir: Path
) -> AsyncIterator[tuple[Path, LlmProxy, Path, LlmProxy]]:
    """Rollouts A and B of one job: run folders laid out as `reroll.rollout.lifecycle` does, each with its
    running proxy in front of the scripted model (run folder A, proxy A, run folder B, proxy B)."""
    script = tmp_path / "script.yaml"
    script.write_text("turns:\n  - content: first\n  - content: second\n")
    model = ModelSpec(spec=f"scripted:{script}", name="scripted", script=script)
    runs = [create_run_folder(jobs_dir / "job", name) for name in ("a", "b")]
    harnesses = [harness_folder(run) for run in runs]
    async with (
        live_upstream(model, harnesses[0]) as upstream,
        LlmProxy(
            workdir=harnesses[0], trajectory_path=runs[0] / TRAJECTORY, upstream=upstream, replay=None
        ) as proxy_a,
        LlmProxy(
            workdir=harnesses[1], trajectory_path=runs[1] / TRAJECTORY, upstream=upstream, replay=None
        ) as proxy_b,
    ):
        yield runs[0], proxy_a, runs[1], proxy_b


async def test_the_agent_token_cannot_set_the_place_and_the_controller_still_can(
    two_rollouts: tuple[Path, LlmProxy, Path, LlmProxy],
) -> None:
    _, _, run, proxy = two_rollouts
    place = Place(turn=0, scene="main", role="agent", round=0)
    await proxy.set_place(place)  # the controller's call, with its own token
    assert await post(controller_url(proxy, "/_reroll/place"), proxy.token, FORGED) == 403
    async with (
        aiohttp.ClientSession(headers={"x-api-key": proxy.token}) as session,
        session.get(controller_url(proxy, "/_reroll/status")) as response,
    ):
        assert response.status == 403
    assert await post(chat(proxy), proxy.controller_token, HELLO) == 401  # no model credential
    assert await post(chat(proxy), proxy.token, HELLO) == 200
    assert recorded_places(run) == [place.model_dump(mode="json")]
    assert (await proxy.status()).served_live == 1


async def test_a_foreign_token_is_refused_and_not_recorded(
    two_rollouts: tuple[Path, LlmProxy, Path, LlmProxy],
) -> None:
    """Rollout A's agent (or anyone guessing) calls rollout B's proxy: 401, nothing in B's recording."""
    run_a, proxy_a, run_b, proxy_b = two_rollouts
    for token in (proxy_a.token, proxy_a.controller_token, secrets.token_urlsafe(24)):
        assert await post(chat(proxy_b), token, HELLO) == 401
        assert await post(controller_url(proxy_b, "/_reroll/place"), token, FORGED) == 401
    assert recorded_places(run_b) == []
    assert await post(chat(proxy_b), proxy_b.token, HELLO) == 200  # B's own agent is served
    assert recorded_places(run_b) == [None] and recorded_places(run_a) == []
    assert (await proxy_b.status()).served_live == 1 and (await proxy_a.status()).served_live == 0


async def test_the_harness_is_root_only_and_no_file_holds_the_controller_token(
    two_rollouts: tuple[Path, LlmProxy, Path, LlmProxy],
) -> None:
    run_a, proxy_a, run_b, proxy_b = two_rollouts
    for run, proxy in ((run_a, proxy_a), (run_b, proxy_b)):
        config = run / PROXY_CONFIG
        assert proxy.token in config.read_text()
        assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
    files = [path for path in run_a.parent.parent.rglob("*") if path.is_file()]
    assert len(files) >= 6  # configs, ready files, trajectories (and, per-rollout, the processes' logs)
    for path in files:
        text = path.read_bytes()
        assert proxy_a.controller_token.encode() not in text and proxy_b.controller_token.encode() not in text


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
async def test_an_unprivileged_process_cannot_read_another_rollouts_harness(
    two_rollouts: tuple[Path, LlmProxy, Path, LlmProxy],
) -> None:
    """A real process of another uid (as the sandbox's agent user is) opens B's ``proxy.json``."""
    _, _, run_b, proxy_b = two_rollouts
    snoop = [
        "setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups", "--",
        sys.executable, "-c",
        "import pathlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try: print(name, pathlib.Path(name).read_text()[:200])\n"
        "    except OSError as exc: print(name, type(exc).__name__)\n",
        str(run_b / PROXY_CONFIG), str(run_b / PROXY_CONFIG.parent / "proxy.ready.json"),
    ]  # fmt: skip
    done = subprocess.run(snoop, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.count("PermissionError") == 2, done.stdout
    assert proxy_b.token not in done.stdout
    # The same process reads what others may read in the same run folder (it is no blanket refusal).
    (run_b / "config.json").write_text("{}")
    (run_b / "config.json").chmod(0o644)
    control = subprocess.run(
        [*snoop[:-2], str(run_b / "config.json")], capture_output=True, text=True, timeout=30, check=True
    )
    assert "{}" in control.stdout, control.stdout


FORGER = r"""
python3 - <<'EOF'
import json, os, urllib.error, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
def call(url, body, headers):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={**headers, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
forged = {"turn": 7, "scene": "main", "role": "reviewer", "round": 7}
root = base.removesuffix("/v1")
codes = {
    "place-bearer": call(root + "/_reroll/place", forged, {"Authorization": "Bearer " + key}),
    "place-x-api-key": call(root + "/_reroll/place", forged, {"x-api-key": key}),
    "status": call(root + "/_reroll/status", None, {"Authorization": "Bearer " + key}),
    "chat": call(base + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                 {"Authorization": "Bearer " + key}),
}
print(json.dumps(codes))
with open(os.path.join(os.environ["REROLL_WORKSPACE"], "attack.json"), "w") as out:
    json.dump(codes, out)
EOF
"""
TEST_SH = """#!/bin/sh
CODES="$(cat "$REROLL_WORKSPACE/attack.json")"
echo "CODES:$CODES"
mkdir -p "$REROLL_LOGS_DIR/verifier"
REWARD=0; echo "$CODES" | grep -q '"place-[a-z-]*": 204' && REWARD=1
echo $REWARD > "$REROLL_LOGS_DIR/verifier/reward.txt"
"""


@pytest.mark.slow
def test_an_agent_cannot_forge_its_place_in_a_real_rollout(tmp_path: Path) -> None:
    """The malicious agent POSTs ``/_reroll/place`` with its own token from inside the `local`
    sandbox; the verifier pays 1 if that was accepted. The recording keeps the controller's place."""
    agents = {
        "forger": {
            "description": "forges its trial place",
            "api_format": "openai-chat",
            "launch": FORGER,
            "env": {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}"},
        }
    }
    (tmp_path / "agents.yaml").write_text(json.dumps(agents))
    script = tmp_path / "script.yaml"
    script.write_text("turns:\n  - content: done\n")
    front = {"name": "forge", "verifier": {"timeout_sec": 60}, "environment": {"network": "full"}}
    task = write_files(
        tmp_path / "task",
        {"task.md": f"---\n{json.dumps(front)}\n---\nDo it.\n", "verifier/test.sh": TEST_SH},
    )
    done = subprocess.run(
        [
            REROLL,
            "run",
            str(task),
            "--agent",
            "forger",
            "--model",
            f"scripted:{script}",
            "--jobs-dir",
            "jobs",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, REROLL_AGENTS_FILE=str(tmp_path / "agents.yaml")),
        timeout=300,
    )
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = (tmp_path / "jobs").glob("*/forge__*/result.json")
    run = result_file.parent
    result = json.loads(result_file.read_text())
    stdout = (run / "verifier" / "test-stdout.txt").read_text()
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 0.0}), (result, stdout)
    codes = json.loads(stdout.partition("CODES:")[2].splitlines()[0])
    assert codes == {"place-bearer": 403, "place-x-api-key": 403, "status": 403, "chat": 200}, codes
    (place,) = recorded_places(run)
    assert place is not None and (place["turn"], place["role"]) == (0, "agent"), place
    assert stat.S_IMODE((run / PROXY_CONFIG).stat().st_mode) == 0o600
    assert stat.S_IMODE((run / PROXY_CONFIG).parent.stat().st_mode) == 0o700
    token = json.loads((run / PROXY_CONFIG).read_text())["token"].encode()
    holding = [path for path in run.rglob("*") if path.is_file() and token in path.read_bytes()]
    assert holding == [run / PROXY_CONFIG]
    assert [path for path in holding if readable_by_others(run, path)] == []


def readable_by_others(run: Path, path: Path) -> bool:
    """Whether a user who may enter `run` may also read `path` in it (o+x on each folder, o+r)."""
    folders = [run / parent for parent in reversed(path.relative_to(run).parents)]  # run, run/harness…
    searchable = all(folder.stat().st_mode & stat.S_IXOTH for folder in folders)
    return searchable and bool(path.stat().st_mode & stat.S_IROTH)
