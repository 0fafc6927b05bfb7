"""Loading a task's environment plane: BenchFlow's environment.toml manifest (pinned from task.md
or beside it), the same fields inline, and Harbor's compose file; `reroll task check` shows them."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from reroll.rollout.start import load_runnable_task
from reroll.tasks.check import check, render
from reroll.tasks.environment import ServiceSpec
from reroll.tasks.manifest import REGISTRY_VARIABLE, compose_seconds, parse_state, resolve_manifest
from reroll.tasks.spec import EnvironmentSection
from reroll.tasks.task import Task, load_task
from reroll.tasks.variants import with_environment
from reroll_contracts.errors import TaskError
from rich.console import Console

CLAWSBENCH_MANIFEST = """
[environment]
name           = "clawsbench"
base_image     = "kywch/smolclaws-base:latest"
owns_lifecycle = false
isolation      = "per_task"
ports          = [9001]

[environment.task_selection]
mechanism = "image"

[environment.readiness]
timeout_sec = 60

[environment.forward_env]
keys = ["ANTHROPIC_API_KEY"]

[[environment.services]]
name    = "gmail"
command = "claw-gmail --db /data/gmail.db serve --port 9001"
port    = 9001
"""

CHI_BENCH_MANIFEST = """
[environment]
name  = "chi-bench"
image = "chi-bench:latest"

[environment.task_selection]
mechanism   = "env_var"
key         = "CHI_BENCH_TASK_ID"

[environment.readiness]
http        = ["http://localhost:8023/health"]
tcp         = [8020]
timeout_sec = 120
"""


def _task(folder: Path, front: str = "", files: dict[str, str] | None = None) -> Task:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.md").write_text(f"---\n{front}\n---\nDo it.\n" if front else "Do it.\n")
    (folder / "verifier").mkdir(exist_ok=True)
    (folder / "verifier" / "test.sh").write_text("exit 0\n")
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return load_task(folder)


def test_a_pinned_manifest_is_read_as_benchflow_writes_it(tmp_path: Path) -> None:
    (tmp_path / "clawsbench.toml").write_text(CLAWSBENCH_MANIFEST)
    task = _task(tmp_path / "tasks" / "t1", "benchflow:\n  environment:\n    manifest: ../../clawsbench.toml")
    environment = task.spec.environment
    assert environment.owns_lifecycle is False
    assert [service.name for service in environment.services] == ["gmail"]
    assert environment.services[0].if_installed  # probed and skipped where missing, as BenchFlow does
    assert environment.services[0].describe_probe().startswith("GET http://localhost:9001/health")
    assert environment.readiness.timeout_sec == 60
    assert environment.task_selection is not None and environment.task_selection.mechanism == "image"
    assert environment.docker_image == "kywch/smolclaws-base:latest"  # no Dockerfile: it runs as is
    assert task.ignored == []  # ports: the endpoints (issue 30)
    assert environment.endpoints() == ["http://localhost:9001"]
    assert "manifest.base_image" in {note.field for note in task.mapped}


def test_an_environment_toml_beside_the_task_owns_its_lifecycle_by_default(tmp_path: Path) -> None:
    task = _task(tmp_path / "chi", files={"environment.toml": CHI_BENCH_MANIFEST})
    environment = task.spec.environment
    assert environment.owns_lifecycle is True  # BenchFlow's manifest default
    assert environment.docker_image == "chi-bench:latest"
    assert environment.readiness.http == ["http://localhost:8023/health"]
    assert environment.readiness.tcp == [8020]
    assert environment.task_selection is not None and environment.task_selection.key == "CHI_BENCH_TASK_ID"
    assert task.ignored == []


def test_the_tasks_own_fields_win_over_its_manifest(tmp_path: Path) -> None:
    task = _task(
        tmp_path / "chi",
        "environment:\n  readiness:\n    timeout_sec: 5\n  docker_image: mine:1",
        files={"environment.toml": CHI_BENCH_MANIFEST},
    )
    assert task.spec.environment.readiness.timeout_sec == 5
    assert task.spec.environment.docker_image == "mine:1"


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ('[environment]\nname = "x"\n', "either 'image' or 'base_image'"),
        ('[environment]\nimage = "x"\nowns_lifecycle = false\n', "needs \\[\\[environment.services\\]\\]"),
        ('name = "x"\n', "needs an \\[environment\\] table"),
        ("[environment\n", "does not load"),
        (
            CHI_BENCH_MANIFEST + '[[environment.services]]\nname = "a"\ncommand = "x"\nport = 1\n',
            "owns_lifecycle",
        ),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_file(tmp_path: Path, manifest: str, message: str) -> None:
    with pytest.raises(TaskError, match=message) as caught:
        _task(tmp_path / "t", files={"environment.toml": manifest})
    assert "task.md" in str(caught.value)


def test_a_pin_to_a_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="names no file"):
        _task(tmp_path / "t", "benchflow:\n  environment:\n    manifest: nope.toml")


def test_inline_services_with_probes_load_from_task_md(tmp_path: Path) -> None:
    front = """
sandbox:
  services:
    - name: api
      command: python3 -m http.server 8000
      port: 8000
      depends_on: [db]
    - name: db
      command: ./db
      health: {command: "test -e /tmp/db.ready", interval_sec: 0.5, retries: 2}
  owns_lifecycle: false
  healthcheck: {http: "http://localhost:8000/", timeout_sec: 2}
"""
    environment = _task(tmp_path / "t", front).spec.environment
    api, db = environment.services
    assert api.depends_on == ["db"] and api.probe is not None and api.probe.http == "/health"
    assert db.describe_probe() == "`test -e /tmp/db.ready` exits 0 (every 0.5 s, 2 retries)"
    assert environment.healthcheck is not None and environment.healthcheck.timeout_sec == 2
    assert not api.if_installed and not db.if_installed  # a task's own services always start


def test_owns_lifecycle_with_a_probe_inline_in_task_toml(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text("exit 0\n")
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "task.toml").write_text(
        '[environment]\nowns_lifecycle = true\n[environment.healthcheck]\ncommand = "curl -f localhost:1"\n'
        'retries = 5\n[environment.task_selection]\nkey = "TASK"\ninject_into = "exec"\n'
    )
    environment = load_task(folder).spec.environment
    assert environment.owns_lifecycle and environment.services == []
    assert environment.healthcheck is not None and environment.healthcheck.retries == 5
    assert environment.task_selection is not None and environment.task_selection.inject_into == "exec"


COMPOSE = """
services:
  main:
    build: {context: .}
    volumes: ["./x:/x"]
  db:
    image: postgres:16
    environment: [POSTGRES_PASSWORD=pw, EMPTY=]
    ports: ["5432:5432"]
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U postgres"]
      interval: 1m30s
      timeout: 500ms
      retries: 4
  api:
    image: api:1
    command: ["serve", "--port", "80"]
    depends_on: {db: {condition: service_healthy}}
"""


def test_harbors_compose_file_becomes_image_services(tmp_path: Path) -> None:
    task = _task(tmp_path / "t", files={"environment/docker-compose.yaml": COMPOSE})
    db, api = task.spec.environment.services
    assert (db.image, db.env) == ("postgres:16", {"POSTGRES_PASSWORD": "pw", "EMPTY": ""})
    assert db.health is not None and db.health.command == "pg_isready -U postgres"
    assert (db.health.interval_sec, db.health.timeout_sec, db.health.retries) == (90.0, 0.5, 4)
    assert (api.command, api.depends_on) == ("serve --port 80", ["db"])
    assert task.compose_file == tmp_path / "t" / "environment" / "docker-compose.yaml"
    assert {note.field for note in task.ignored} == {
        "docker-compose.services.db.ports",
        "docker-compose.services.main.volumes",
    }
    assert "docker-compose.services.main" in {note.field for note in task.mapped}


def test_a_compose_file_named_yml_is_not_harbors(tmp_path: Path) -> None:
    """Harbor and BenchFlow read ``environment/docker-compose.yaml`` only; SkillsBench's
    react-performance-debugging ships a developer's ``docker-compose.yml`` whose ``website`` service
    has no Dockerfile (its Dockerfile builds everything): it must not be loaded, let alone refused."""
    compose = "services:\n  website:\n    build: ./website\n"
    task = _task(
        tmp_path / "t",
        files={"environment/docker-compose.yml": compose, "environment/Dockerfile": "FROM x\n"},
    )
    assert task.compose_file is None
    assert task.spec.environment.services == []


@pytest.mark.parametrize(
    ("compose", "message"),
    [
        ("services: [a]", "needs a 'services' mapping"),
        ("services:\n  x: {command: run}", "neither 'build' nor 'image'"),
        ("services:\n  x: {image: a, healthcheck: {test: 3}}", "not a command"),
        ("services:\n  x: {image: a, healthcheck: {test: [CMD, x], interval: soon}}", "not a duration"),
        ("services: {\n", "does not load"),
    ],
)
def test_a_bad_compose_file_is_refused_naming_it(tmp_path: Path, compose: str, message: str) -> None:
    with pytest.raises(TaskError, match=message) as caught:
        _task(tmp_path / "t", files={"environment/docker-compose.yaml": compose})
    assert "docker-compose.yaml" in str(caught.value)


BUILT = """
services:
  main:
    build: {context: ../../shared, args: {X: "1"}}
  worker:
    build: {dockerfile: Dockerfile.worker}
    depends_on: [cache]
  cache:
    build: ../../shared
"""


def test_compose_builds_of_the_sandbox_and_of_services(tmp_path: Path) -> None:
    """Compose's ``build``: contexts relative to the compose file's folder, also outside the task;
    ``main`` is the sandbox built there, every other built service a sibling built by reroll."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "Dockerfile").write_text("FROM reroll/base:bookworm\n")
    task = _task(
        tmp_path / "t",
        files={"environment/docker-compose.yaml": BUILT, "environment/Dockerfile.worker": "FROM x\n"},
    )
    environment = task.spec.environment
    assert environment.build is not None and Path(environment.build.context) == shared
    assert (task.dockerfile, task.build_context) == (shared / "Dockerfile", shared)
    worker, cache = environment.services
    assert worker.build is not None and worker.sibling and worker.image is None
    assert task.service_context(worker) == tmp_path / "t" / "environment"
    assert worker.build.dockerfile == "Dockerfile.worker" and worker.depends_on == ["cache"]
    assert cache.build is not None and task.service_context(cache) == shared
    assert worker.describe_probe() == "running"
    assert {note.field for note in task.ignored} == {"docker-compose.services.main.build.args"}
    mapped = {note.field: note.note for note in task.mapped}
    assert (
        mapped["docker-compose.services.main"]
        == "the sandbox itself (built from Dockerfile in ../../shared/)"
    )


@pytest.mark.parametrize("context", [".", "${CONTEXT_DIR}", "$CONTEXT_DIR"])
def test_a_main_service_built_from_environment_is_the_tasks_own_dockerfile(
    tmp_path: Path, context: str
) -> None:
    compose = f"services:\n  main:\n    build: {{context: '{context}'}}\n"
    task = _task(
        tmp_path / "t",
        files={"environment/docker-compose.yaml": compose, "environment/Dockerfile": "FROM x\n"},
    )
    assert task.spec.environment.build is None
    assert (task.dockerfile, task.build_context) == (
        task.path / "environment" / "Dockerfile",
        task.path / "environment",
    )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        ("{context: ../nowhere}", "build.context '../nowhere': no such folder"),
        ("{dockerfile: Missing.df}", "build.dockerfile: no such file"),
        ("{dockerfile: ../task.toml}", "must be a relative path inside the context"),
        ("{context: '${HOME}'}", "only Harbor's ${CONTEXT_DIR} is substituted"),
        ("3", "a context path or a mapping is expected"),
    ],
)
def test_a_bad_compose_build_is_refused_naming_the_service(tmp_path: Path, build: str, message: str) -> None:
    compose = f"services:\n  main: {{build: .}}\n  api:\n    build: {build}\n"
    with pytest.raises(TaskError, match=re.escape(message)) as caught:
        _task(tmp_path / "t", files={"environment/docker-compose.yaml": compose})
    assert "docker-compose.yaml: service 'api'" in str(caught.value)


def test_compose_durations() -> None:
    assert compose_seconds("1h2m3.5s", "f") == 3723.5
    assert compose_seconds(7, "f") == 7.0
    with pytest.raises(TaskError, match="f: '1x'"):
        compose_seconds("1x", "f")


def test_task_check_shows_services_readiness_and_state(tmp_path: Path) -> None:
    (tmp_path / "clawsbench.toml").write_text(
        CLAWSBENCH_MANIFEST + '[environment.state]\nkind = "sqlite"\npaths = ["/data/gmail.db"]\n'
    )
    _task(tmp_path / "t", "benchflow:\n  environment:\n    manifest: ../clawsbench.toml")
    out = io.StringIO()
    render(check([tmp_path / "t"], load_runnable_task), Console(file=out, width=400))
    text = out.getvalue()
    assert "service gmail" in text and "GET http://localhost:9001/health" in text
    # the entry point is the manifest's image's own: task check says the task folder lacks it
    assert "claw-gmail is not in the task folder: only the sandbox's image" in text
    assert "within 60 s" in text
    assert "its [environment] under the task's" in text  # the task's brackets are no markup
    assert "sqlite: /data/gmail.db" in text
    assert "http://localhost:9001 (from the sandbox; none published to the host)" in text
    assert "ANTHROPIC_API_KEY (never: named like a secret)" in text


def test_an_inline_build_is_relative_to_the_task_and_must_exist(tmp_path: Path) -> None:
    front = "sandbox:\n  services:\n    - {name: api, build: {context: api}}\n"
    with pytest.raises(
        TaskError, match=r"task.md: service api: build: no Dockerfile Dockerfile in the context"
    ):
        _task(tmp_path / "t", front)
    task = _task(tmp_path / "t", front, files={"api/Dockerfile": "FROM x\n"})
    (api,) = task.spec.environment.services
    assert task.service_context(api) == tmp_path / "t" / "api" and api.describe_probe() == "running"


MAIN_ENV = """
services:
  main:
    build: .
    environment: {API_URL: "http://api:80", MODE: test}
    volumes: [shared:/data]
  api:
    image: api:1
    volumes: [shared:/srv/data]
volumes:
  shared: {}
"""


def test_a_compose_main_services_environment_is_the_sandboxs_and_its_volumes_are_reported(
    tmp_path: Path,
) -> None:
    """Issue 29 (10): ``services.main.environment`` reaches every phase (the task's own ``env``
    winning), and a volume ``main`` shares with a service, not applied, is named by ``task check``."""
    task = _task(
        tmp_path / "t",
        front="environment:\n  env: {MODE: own}",
        files={"environment/docker-compose.yaml": MAIN_ENV, "environment/Dockerfile": "FROM x\n"},
    )
    assert task.spec.environment.env == {"API_URL": "http://api:80", "MODE": "own"}
    ignored = {note.field: note.note for note in task.ignored}
    assert "shared" in ignored["docker-compose.services.main.volumes"]
    assert "api" in ignored["docker-compose.services.main.volumes"]
    mapped = {note.field: note.note for note in task.mapped}
    assert "environment.env" in mapped["docker-compose.services.main.environment"]


def test_a_run_binds_a_manifest_by_file_or_registry_name(tmp_path: Path) -> None:
    """``--environment-manifest`` / ``--state`` (BenchFlow's): a file, or NAME[@VERSION] in
    ``$BENCHFLOW_ENV_REGISTRY`` (a bare name: NAME.toml, else its last version)."""
    registry = tmp_path / "registry"
    registry.mkdir()
    for stem in ("env0@2026.1", "env0@2026.2", "solo"):
        (registry / f"{stem}.toml").write_text(CLAWSBENCH_MANIFEST)
    environ = {REGISTRY_VARIABLE: str(registry)}
    assert resolve_manifest("env0@2026.1", environ) == registry / "env0@2026.1.toml"
    assert resolve_manifest("env0", environ) == registry / "env0@2026.2.toml"
    assert resolve_manifest("solo", environ) == registry / "solo.toml"
    assert resolve_manifest(str(registry / "solo.toml"), {}) == registry / "solo.toml"
    with pytest.raises(TaskError, match=r"not in the registry .* it holds: env0@2026.1, env0@2026.2, solo"):
        resolve_manifest("env1@prod", environ)
    with pytest.raises(TaskError, match=r"\$BENCHFLOW_ENV_REGISTRY names, which is not set"):
        resolve_manifest("env0", {})
    assert parse_state('{"name": "env0@2026.1", "tools": ["gmail"]}', environ) == (
        registry / "env0@2026.1.toml",
        ("gmail",),
    )
    assert parse_state("solo", environ) == (registry / "solo.toml", None)
    with pytest.raises(TaskError, match='a JSON object with a "name"'):
        parse_state('{"tools": ["gmail"]}', environ)


def test_a_bound_manifest_replaces_the_tasks_own_and_state_keeps_its_tools(tmp_path: Path) -> None:
    (tmp_path / "clawsbench.toml").write_text(CLAWSBENCH_MANIFEST)
    (tmp_path / "chi.toml").write_text(CHI_BENCH_MANIFEST)
    task = _task(tmp_path / "tasks" / "t1", "benchflow:\n  environment:\n    manifest: ../../chi.toml")
    assert task.spec.environment.docker_image == "chi-bench:latest"
    bound = with_environment(task, tmp_path / "clawsbench.toml", None)
    assert bound.spec.environment.docker_image == "kywch/smolclaws-base:latest"
    assert [service.name for service in bound.spec.environment.services] == ["gmail"]
    assert task.spec.environment.services == []  # the task as loaded is not changed
    assert (
        with_environment(bound, None, ("gmail",)).spec.environment.services == bound.spec.environment.services
    )
    with pytest.raises(
        TaskError, match=r"--state tools gcal: not services of the environment \(it declares: gmail\)"
    ):
        with_environment(bound, None, ("gcal",))


FIXTURE = Path(__file__).parents[1] / "fixtures" / "benchflow-manifest-reset"


def _check_text(task: Path) -> str:
    out = io.StringIO()
    render(check([task], load_runnable_task), Console(file=out, width=400))
    return out.getvalue()


def test_ports_are_the_environments_endpoints_never_published(tmp_path: Path) -> None:
    """BenchFlow's ``ports`` (with its services' own: ``EnvHandle.endpoints``): task check lists
    them as the sandbox sees them; an image service's by its name; nothing is ignored."""
    task = load_task(FIXTURE)
    assert task.ignored == []
    assert task.spec.environment.ports == [8141]
    assert task.spec.environment.endpoints() == ["http://localhost:8140", "http://localhost:8141"]
    assert "http://localhost:8140, http://localhost:8141 (from the sandbox; none published to the host)" in (
        _check_text(FIXTURE)
    )
    services = [
        ServiceSpec(name="db", image="postgres:16", port=5432),
        ServiceSpec(name="c", command="c", port=80),
    ]
    section = EnvironmentSection(ports=[8141, 80], services=services)
    assert section.endpoints() == ["http://db:5432", "http://localhost:80", "http://localhost:8141"]


def test_a_port_that_is_no_tcp_port_is_refused(tmp_path: Path) -> None:
    manifest = (
        (FIXTURE / "environment.toml").read_text().replace("ports          = [8141]", "ports = [70000]")
    )
    with pytest.raises(TaskError, match=r"ports must be TCP ports \(1-65535\), not \[70000\]"):
        _task(tmp_path / "t", files={"environment.toml": manifest})


def test_persistent_isolation_and_keep_alive_are_reported_as_they_run(tmp_path: Path) -> None:
    """``isolation = "persistent"`` runs per_task, and the task's notes and task check say why;
    ``keep_alive = false`` is taken and shown."""
    manifest = (
        (FIXTURE / "environment.toml")
        .read_text()
        .replace('isolation      = "per_task"', 'isolation = "persistent"')
        .replace("keep_alive     = true", "keep_alive = false")
    )
    folder = tmp_path / "t"
    task = _task(folder, files={"environment.toml": manifest})
    assert task.spec.environment.isolation == "persistent" and task.spec.environment.keep_alive is False
    (note,) = task.ignored
    assert note.field == "manifest.isolation" and "runs as per_task" in note.note and "replay" in note.note
    text = " ".join(_check_text(folder).split())
    assert "│ isolation │ persistent runs as per_task: every rollout starts" in text
    assert "│ keep_alive │ false: a service may exit once ready (recorded, not a crash)" in text


def test_a_value_benchflow_refuses_is_refused(tmp_path: Path) -> None:
    manifest = (FIXTURE / "environment.toml").read_text().replace('"per_task"', '"shared"')
    with pytest.raises(TaskError, match="isolation"):
        _task(tmp_path / "t", files={"environment.toml": manifest})
