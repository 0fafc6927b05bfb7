"""The task's services in a real rollout (`reroll run --agent oracle`, the `local` sandbox): the
readiness gate holds the agent until a slow service is healthy; one never healthy, or one that
exits before it is, ends the rollout as ``environment_error`` naming it, its probe and its log;
one crashing while the agent runs is reported after the agent. Services are stdlib Python
scripts run by the sandbox's ``python3``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from reroll.environment.services import Environment
from reroll.sandbox.base import Sandbox
from reroll.tasks.environment import ForwardEnv
from reroll.tasks.task import load_task

pytestmark = pytest.mark.spawns
REROLL = str(Path(sys.executable).parent / "reroll")

SERVICE = """
import http.server, sys, threading, time, os
delay, port, lifetime = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
print(f"booting, ready in {delay} s; task {os.environ.get('WHICH_TASK', '-')}", flush=True)
time.sleep(delay)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"healthy")

server = http.server.HTTPServer(("127.0.0.1", port), Health)
print("listening", flush=True)
if lifetime != 0:  # > 0: exits after that many seconds; < 0: once the agent wrote seen.txt
    threading.Thread(target=server.serve_forever, daemon=True).start()
    deadline = time.time() + lifetime
    while time.time() < deadline if lifetime > 0 else not os.path.exists("seen.txt"):
        time.sleep(0.1)
    print("giving up", flush=True)
    os._exit(3)
server.serve_forever()
"""

SOLVE = """
python3 - <<'EOF'
import time, urllib.request
started = time.time()
answer = urllib.request.urlopen("http://127.0.0.1:8123/health", timeout=5).read().decode()
open("seen.txt", "w").write(answer)
print(f"agent started at {started}", flush=True)
EOF
sleep "${SOLVE_SLEEP:-0}"
"""


def service_task(
    folder: Path, services: list[dict[str, Any]], timeout: float = 30, solve_sleep: int = 0
) -> Path:
    """A native task whose oracle GETs the service on port 8123 and records when it started."""
    front = {
        "name": "with-service",
        "agent": {"timeout_sec": 60},
        "solution": {"env": {"SOLVE_SLEEP": str(solve_sleep)}},
        "environment": {
            "services": services,
            "readiness": {"timeout_sec": timeout},
            "task_selection": {"key": "WHICH_TASK"},
        },
    }
    (folder / "verifier").mkdir(parents=True)
    (folder / "oracle").mkdir()
    (folder / "environment" / "workspace").mkdir(parents=True)
    (folder / "environment" / "workspace" / "service.py").write_text(SERVICE)
    (folder / "task.md").write_text(f"---\n{yaml.safe_dump(front)}---\nGET the service.\n")
    (folder / "oracle" / "solve.sh").write_text(SOLVE)
    (folder / "verifier" / "test.sh").write_text(
        'grep -q healthy "$REROLL_WORKSPACE/seen.txt" && echo 1 > /logs/verifier/reward.txt\n'
    )
    return folder


def oracle_run(
    task: Path, tmp_path: Path, sandbox: str = "local", extra: tuple[str, ...] = ()
) -> tuple[dict[str, Any], Path]:
    """``reroll run TASK --agent oracle`` on `sandbox` (with `extra` flags), in job ``j`` under
    `tmp_path`: its result.json and run folder."""
    done = subprocess.run(
        [
            REROLL,
            "run",
            str(task),
            "--agent",
            "oracle",
            "--sandbox",
            sandbox,
            "--job-name",
            "j",
            "--jobs-dir",
            str(tmp_path),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(done.stdout, done.stderr, sep="\n")
    (run,) = (tmp_path / "j").iterdir()
    return json.loads((run / "result.json").read_text()), run


def service(delay: float, lifetime: float = 0) -> dict[str, Any]:
    return {
        "name": "slow",
        "command": f"exec python3 service.py {delay} 8123 {lifetime}",
        "port": 8123,
        "health": {"http": "/health", "interval_sec": 0.5},
    }


def test_the_agent_starts_only_after_the_service_is_healthy(tmp_path: Path) -> None:
    result, run = oracle_run(service_task(tmp_path / "task", [service(3)]), tmp_path / "jobs")
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}
    (record,) = json.loads((run / "services" / "services.json").read_text())
    assert record["ready_at"] - record["started_at"] >= 3
    log = (run / "services" / "slow.log").read_text()
    assert "booting, ready in 3.0 s; task with-service" in log  # the task selection variable
    output = (run / "agent" / "output.log").read_text()
    agent_started = float(output.split("agent started at ", 1)[1].split()[0])
    assert agent_started > record["ready_at"]
    assert record["exit_code"] is None  # torn down, not crashed


def test_a_service_never_healthy_ends_the_rollout_as_environment_error(tmp_path: Path) -> None:
    never = {"name": "never", "command": "echo starting up; exec sleep 600", "port": 8124}
    result, run = oracle_run(service_task(tmp_path / "task", [never], timeout=3), tmp_path / "jobs")
    assert (result["status"], result["error_category"]) == ("error", "environment_error")
    error = result["error"]
    assert "service never was not ready within 3 s" in error
    assert "GET http://localhost:8124/health" in error
    assert "starting up" in error  # the end of its log
    assert not (run / "agent" / "output.log").exists()  # the agent never started


def test_a_service_exiting_before_it_is_ready_is_named_at_once(tmp_path: Path) -> None:
    broken = {"name": "broken", "command": "echo no config >&2; exit 4", "port": 8125}
    result, _ = oracle_run(service_task(tmp_path / "task", [broken], timeout=60), tmp_path / "jobs")
    assert result["error_category"] == "environment_error"
    assert "service broken exited with code 4 before it was ready" in result["error"]
    assert "no config" in result["error"]
    assert result["timings"]["total_seconds"] < 45


def test_a_service_crashing_while_the_agent_runs_is_reported(tmp_path: Path) -> None:
    task = service_task(tmp_path / "task", [service(0, lifetime=-1)], solve_sleep=4)
    result, run = oracle_run(task, tmp_path / "jobs")
    assert (result["status"], result["error_category"]) == ("error", "environment_error")
    assert "service slow crashed while the agent ran (exit code 3)" in result["error"]
    assert "giving up" in result["error"]
    assert "rewards" not in result or not result["rewards"]  # not verified on a broken world
    (record,) = json.loads((run / "services" / "services.json").read_text())
    assert record["exit_code"] == 3


def test_dependencies_start_in_order(tmp_path: Path) -> None:
    first: dict[str, Any] = {"name": "first", "command": "sleep 1; touch /tmp/first.ready; exec sleep 600"}
    first["health"] = {"command": "test -e /tmp/first.ready", "interval_sec": 0.2}
    dependent = service(0) | {"depends_on": ["first"]}
    dependent["command"] = "test -e /tmp/first.ready || exit 9; " + str(dependent["command"])
    result, run = oracle_run(service_task(tmp_path / "task", [dependent, first]), tmp_path / "jobs")
    assert result["status"] == "ok", result.get("error")
    records = {r["name"]: r for r in json.loads((run / "services" / "services.json").read_text())}
    assert records["slow"]["started_at"] >= records["first"]["ready_at"]


def test_owns_lifecycle_on_local_gates_on_the_probes_alone(tmp_path: Path) -> None:
    task = service_task(tmp_path / "task", [], timeout=2)
    text = (
        (task / "task.md")
        .read_text()
        .replace("services: []", "owns_lifecycle: true\n  healthcheck:\n    command: test -e /tmp/never")
    )
    (task / "task.md").write_text(text)
    result, _ = oracle_run(task, tmp_path / "jobs")
    assert result["error_category"] == "environment_error"
    assert "the environment was not ready within 2 s" in result["error"]
    assert "probe failing: `test -e /tmp/never` exits 0" in result["error"]


def test_a_service_whose_program_is_not_installed_is_skipped(tmp_path: Path) -> None:
    """A manifest's services (``if_installed``) start only where their program runs, as BenchFlow
    probes them; what depends on a skipped one starts without it."""
    missing = {"name": "claw", "command": "claw-notes serve --port 8130", "port": 8130, "if_installed": True}
    present = service(0) | {"if_installed": True, "depends_on": ["claw"]}
    result, run = oracle_run(service_task(tmp_path / "task", [present, missing]), tmp_path / "jobs")
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}
    records = {r["name"]: r for r in json.loads((run / "services" / "services.json").read_text())}
    assert records["claw"]["skipped"] == "claw-notes --help exited 127: not installed in this sandbox"
    assert records["claw"]["started_at"] is not None and records["claw"]["ready_at"] is None
    assert records["slow"]["skipped"] is None and records["slow"]["ready_at"] is not None


def test_no_service_installed_ends_the_rollout_as_environment_error(tmp_path: Path) -> None:
    missing = {"name": "claw", "command": "claw-notes serve", "port": 8131, "if_installed": True}
    result, run = oracle_run(service_task(tmp_path / "task", [missing]), tmp_path / "jobs")
    assert (result["status"], result["error_category"]) == ("error", "environment_error")
    assert "none of the environment's 1 service(s) is installed" in result["error"]
    assert "claw-notes" in result["error"]
    assert not (run / "agent" / "output.log").exists()


MANIFEST = """
[environment]
name = "one-manifest"
base_image = "reroll/base:bookworm"
owns_lifecycle = false

[[environment.services]]
name = "slow"
command = "python3 service.py 0 8123 0"
port = 8123

[[environment.services]]
name = "claw"
command = "claw-notes serve --port 8130"
port = 8130
"""


def test_a_run_binds_a_manifest_whose_services_are_probed(tmp_path: Path) -> None:
    """``reroll run --environment-manifest FILE`` (BenchFlow's): the manifest's services, not the
    task's; the one this sandbox lacks is skipped; config.json records the binding."""
    task = service_task(tmp_path / "task", [])
    front = (task / "task.md").read_text().replace("  services: []\n", "")  # the manifest's, then
    (task / "task.md").write_text(front)
    (task / "environment" / "Dockerfile").write_text(
        "FROM reroll/base:bookworm\nCOPY workspace/ /app/\nWORKDIR /app\n"
    )
    (tmp_path / "one.toml").write_text(MANIFEST)
    result, run = oracle_run(
        task, tmp_path / "jobs", extra=("--environment-manifest", str(tmp_path / "one.toml"))
    )
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}
    records = {r["name"]: r for r in json.loads((run / "services" / "services.json").read_text())}
    assert records["slow"]["ready_at"] is not None and records["claw"]["skipped"] is not None
    config = json.loads((run / "config.json").read_text())
    assert config["environment_manifest"] == str(tmp_path / "one.toml")


def test_task_selection_and_forwarded_variables(tmp_path: Path) -> None:
    task = load_task(service_task(tmp_path / "task", [service(0)]))
    environment = task.spec.environment.model_copy(
        update={"forward_env": ForwardEnv(keys=["REGION", "OPENAI_API_KEY", "UNSET"])}
    )
    task = task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})
    host = {"REGION": "eu", "OPENAI_API_KEY": "sk-secret"}
    services = Environment(cast(Sandbox, None), task, tmp_path, {}, host)
    assert services.service_env() == {"REGION": "eu", "WHICH_TASK": "with-service"}
    assert services.exec_env() == {"REGION": "eu"}  # inject_into "entrypoint": the services only
    assert services.log_path("slow") == tmp_path / "services" / "slow.log"


TAMPER = """
import http.server, os, time
open("attackers", "a").write(f"{os.getpid()}\\n")
while not os.path.exists("/verifier/test.sh"):  # waits for the verifier, then strikes
    time.sleep(0.05)

class Forged(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"forged")

while True:
    open("seen.txt", "w").write("tampered")
    try:  # the service's port, should the service be gone
        http.server.HTTPServer(("127.0.0.1", 8123), Forged).serve_forever()
    except OSError:
        time.sleep(0.05)
"""

GET = """get='import sys,urllib.request as u;print(u.urlopen(sys.argv[1], timeout=5).read().decode(),end="")'
"""

ATTACK = (
    GET
    + """
python3 -c "$get" http://127.0.0.1:8123/health > seen.txt
grep NoNewPrivs /proc/self/status
# A tamperer left in the background, in a session of its own.
setsid python3 tamper.py </dev/null >/dev/null 2>&1 &
# An impostor: the service's own program and command line (but the port), a forged pid file and
# variable, in a session of its own.
REROLL_SERVICE=1 setsid sh -c \\
  'echo $$ >> attackers; echo $$ > /tmp/slow.pid; exec python3 service.py 0 8124 0' \\
  </dev/null >/dev/null 2>&1 &
sleep 1
"""
)

CHECK_LIVE = (
    GET
    + """
sleep 1  # a tamperer still alive has struck by now
body=$(python3 -c "$get" http://127.0.0.1:8123/health) || { echo "the service is unreachable"; exit 0; }
echo "the service answered: $body"
[ "$body" = healthy ] || exit 0
seen=$(cat "$REROLL_WORKSPACE/seen.txt")
[ "$seen" = healthy ] || { echo "seen.txt: $seen"; exit 0; }
for pid in $(cat "$REROLL_WORKSPACE/attackers"); do
  [ -e "/proc/$pid" ] && { echo "attacker $pid alive"; exit 0; }
done
echo 1 > /logs/verifier/reward.txt
"""
)


def live_service_run(tmp_path: Path, sandbox: str) -> tuple[dict[str, Any], Path]:
    """The attack's rollout on `sandbox`: the oracle reads the service, leaves a tamperer and an
    impostor of the service behind; the verifier GETs the service and checks the attackers are
    dead. Asserts reward 1 (the verifier's output in the message), the service alive at teardown."""
    task = service_task(tmp_path / "task", [service(0)])
    (task / "environment" / "workspace" / "tamper.py").write_text(TAMPER)
    (task / "oracle" / "solve.sh").write_text(ATTACK)
    (task / "verifier" / "test.sh").write_text(CHECK_LIVE)
    result, run = oracle_run(task, tmp_path / "jobs", sandbox)
    output = (run / "verifier" / "test-stdout.txt").read_text()
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}, output
    assert "the service answered: healthy" in output
    (record,) = json.loads((run / "services" / "services.json").read_text())
    assert record["exit_code"] is None  # alive until the teardown
    return result, run


def test_the_verifier_queries_a_live_service_while_the_agents_processes_are_dead(tmp_path: Path) -> None:
    """The service outlives the quiesce and the verify's hardening (the verifier GETs it); the
    agent's tamperer and its impostor of the service do not."""
    _, run = live_service_run(tmp_path, "local")
    # No setuid program makes the agent's processes root (which a kill by user would miss).
    assert "NoNewPrivs:\t1" in (run / "agent" / "output.log").read_text()


MANIFEST_TASK = Path(__file__).parents[1] / "fixtures" / "benchflow-manifest-reset"
"""BenchFlow's format: a counter service in SQLite (its manifest's ``[environment.state]``),
seeded to 10 by a setup command; the oracle bumps it once, the verifier wants 11."""


def reset_trial_run(
    tmp_path: Path, sandbox: str, reset: bool, task: Path = MANIFEST_TASK
) -> tuple[dict[str, Any], Path]:
    """`task` (the manifest fixture) in a two-scene trial (the oracle in each) on `sandbox`, the
    second scene with ``reset_environment`` = `reset`: its result.json and run folder."""
    scene = {"roles": [{"name": "solver"}], "turns": [{"role": "solver"}]}
    trial = {
        "task": str(task),
        "scenes": [scene | {"name": "first"}, scene | {"name": "second", "reset_environment": reset}],
    }
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "trial.yaml").write_text(yaml.safe_dump(trial))
    done = subprocess.run(
        [REROLL, "run", "--trial", str(tmp_path / "trial.yaml"), "--agent", "oracle", "--sandbox", sandbox,
         "--job-name", "j", "--jobs-dir", str(tmp_path / "jobs")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    print(done.stdout, done.stderr, sep="\n")
    (run,) = (tmp_path / "jobs" / "j").iterdir()
    assert ("the environment returns to its baseline" in done.stdout) == reset
    return json.loads((run / "result.json").read_text()), run


def test_a_scene_that_resets_the_environment_starts_from_its_baseline(tmp_path: Path) -> None:
    """BenchFlow's ``reset()`` before a scene: the services restarted and the SQLite state as the
    setup command left it (10), so the second scene's bump makes 11 again; without it, 12."""
    result, run = reset_trial_run(tmp_path / "reset", "local", reset=True)
    assert result["status"] == "ok", result.get("error")
    assert (run / "verifier" / "count.txt").read_text().strip() == "11"
    assert result["rewards"] == {"reward": 1.0}
    (record,) = json.loads((run / "services" / "services.json").read_text())
    assert record["exit_code"] is None and record["ready_at"] > record["started_at"]
    assert (run / "services" / "counter.log").read_text().count("serving") == 2  # restarted
    result, run = reset_trial_run(tmp_path / "kept", "local", reset=False)
    assert (run / "verifier" / "count.txt").read_text().strip() == "12"
    assert result["rewards"] == {"reward": 0.0}


def test_keep_alive_false_lets_a_service_exit_once_ready(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest's ``keep_alive = false``: the service that exits (code 3) while the agent runs
    (once the oracle has read it, whatever the load) is recorded, not a crash, and the rollout is
    verified (with the default it is an ``environment_error``:
    `test_a_service_crashing_while_the_agent_runs_is_reported`);
    ``isolation = "persistent"`` runs as per_task and the console says so."""
    task = service_task(tmp_path / "task", [], solve_sleep=4)
    front = (task / "task.md").read_text().replace("  services: []\n", "")
    (task / "task.md").write_text(front)
    (task / "environment" / "Dockerfile").write_text(
        "FROM reroll/base:bookworm\nCOPY workspace/ /app/\nWORKDIR /app\n"
    )
    manifest = MANIFEST.split("[[environment.services]]")[0].replace(
        "owns_lifecycle = false\n", 'owns_lifecycle = false\nkeep_alive = false\nisolation = "persistent"\n'
    )
    (tmp_path / "m.toml").write_text(
        manifest
        + '[[environment.services]]\nname = "slow"\ncommand = "python3 service.py 0 8123 -1"\nport = 8123\n'
    )
    extra = ("--environment-manifest", str(tmp_path / "m.toml"))
    result, run = oracle_run(task, tmp_path / "jobs", extra=extra)
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}
    (record,) = json.loads((run / "services" / "services.json").read_text())
    assert record["exit_code"] == 3 and record["exited_at"] > record["ready_at"]
    assert "isolation = persistent runs as per_task" in " ".join(capsys.readouterr().out.split())


def test_a_reset_restores_a_state_without_services(tmp_path: Path) -> None:
    """A task with an ``[environment.state]`` (files) and no service: the reset restores the
    state as the setup command left it; the workspace is left as the first scene made it."""
    task = service_task(tmp_path / "task", [])
    front = (
        (task / "task.md")
        .read_text()
        .replace(
            "  services: []\n",
            "  state: {kind: files, paths: [/tmp/state]}\n"
            "  setup_commands: [{command: 'mkdir -m 777 /tmp/state; echo seed > /tmp/state/log; "
            "chmod 666 /tmp/state/log'}]\n",
        )
    )
    (task / "task.md").write_text(front)
    (task / "oracle" / "solve.sh").write_text("echo scene >> /tmp/state/log; echo scene >> seen.txt\n")
    (task / "verifier" / "test.sh").write_text(
        "cp /tmp/state/log /logs/verifier/state.txt\n"
        'cp "$REROLL_WORKSPACE/seen.txt" /logs/verifier/seen.txt\n'
        "echo 1 > /logs/verifier/reward.txt\n"
    )
    result, run = reset_trial_run(tmp_path / "run", "local", reset=True, task=task)
    assert result["status"] == "ok", result.get("error")
    assert (run / "verifier" / "state.txt").read_text() == "seed\nscene\n"
    assert (run / "verifier" / "seen.txt").read_text() == "scene\nscene\n"
