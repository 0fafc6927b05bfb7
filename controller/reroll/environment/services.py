"""The task's services for one rollout: started in dependency order, gated on readiness, watched
while the agent runs, torn down with their logs in the run folder (the environment plane's
provision → readiness → teardown; DESIGN.md, "The environment plane").

One `Environment` per rollout, on a started sandbox::

    environment = Environment(sandbox, task, run_dir, env)
    try:
        await environment.provision()        # starts them; returns at once
        await environment.wait_ready()       # raises ServiceNotReadyError
        ...                                  # the agent runs
        environment.check_alive()            # raises ServiceCrashedError
    finally:
        await environment.teardown()         # always; writes services/<name>.log

How each service runs (``environment.services``, `reroll.tasks.environment.ServiceSpec`):

- a *command* service is a process inside the sandbox (every backend), started through
  `Sandbox.exec` with ``service=True``: as the sandbox's own user (root's side; never the agent's
  user), in a process group of its own, its output streamed to ``services/<name>.log``. The
  sidecar remembers it by pid and start time as it spawned it (``reroll_sidecar.quiesce``), so
  the agent's quiesce and the verify's hardening kill every process of the agent — what it left
  in the background, a root process it forked, anything named or pid-filed like the service —
  but spare the service and what *it* forked: the verifier can query it live. A service that
  runs what the agent sends it (a shell endpoint, say) runs it as the service: that is the
  task's own semantics, the service is the task's;
- an *image* service (an ``image``, or a ``build`` the backend builds) is a sibling container
  (`SiblingServices`, the docker backend) on the rollout's private network, reachable by its
  name, under the same firewall, limits and labels as the sandbox; a backend without siblings
  refuses it (``environment_error``);
- an image that owns its services' lifecycle (``owns_lifecycle``, chi-bench) gets its own
  ENTRYPOINT and CMD started in the sandbox (``services/entrypoint.log``), since the sidecar
  replaced them as the container's first process; elsewhere nothing is started.

A service starts once every service it ``depends_on`` is healthy. Its readiness probe
(`ServiceSpec.probe`): a command run as root in the sandbox (an image service's: in its own
container, as compose's healthcheck), or an HTTP GET / TCP connect made by the sidecar's
``probe`` command inside the sandbox's network (``reroll_sidecar.probe``), then the task's
``[environment.readiness]`` URLs and ports and its ``healthcheck``. All of it must pass within
``readiness.timeout_sec`` of `provision`; a service that exits first, or a probe still failing
then, raises `ServiceNotReadyError` naming the service, its probe, the probe's last answer and the
last lines of its log (category ``environment_error``: the task's fault, never retried).

While the agent runs, a service that exits is a crash: the agent is not interrupted (its
recording stays whole), `check_alive` raises `ServiceCrashedError` after it (the rollout ends
as ``environment_error`` without verification: the world it acted on broke). A command service's
exit is seen as it happens; a sibling's when `check_alive` asks. Health probes do not run again
after the gate. The environment variables: the task's selection (``task_selection``, key = the
task's name) goes to every service and to the image's entrypoint; with ``inject_into = "exec"``
also to the rollout's own processes (`exec_env`), as do the forwarded host variables
(``forward_env``; never one named like a secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path

from reroll_contracts.childenv import SECRET_NAME
from reroll_contracts.errors import (
    RerollError,
    ServiceCrashedError,
    ServiceNotReadyError,
    TaskEnvironmentError,
)

from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import SERVICES_DIR, ServiceRecord, write_json
from reroll.sandbox.base import Sandbox
from reroll.sandbox.seam import ServiceProcess, SiblingServices
from reroll.sandbox.sidecar_bundle import ENTRYPOINT
from reroll.tasks.environment import HealthCheck, ServiceSpec, start_order
from reroll.tasks.task import Task

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 20
"""How many of a failed service's last log lines an error quotes."""
LOG_TAIL_CHARS = 2000
INSTALLED_PROBE_SECONDS = 15.0
"""How long a service's ``--help`` probe may take (`Environment._installed`; BenchFlow's too)."""
ENTRYPOINT_SERVICE = "entrypoint"
"""The name of the image's own entrypoint (``owns_lifecycle``) among the records and logs."""


class _ExecService:
    """A command service: a process inside the sandbox, started by `Sandbox.exec`."""

    def __init__(self, sandbox: Sandbox, argv: list[str], cwd: str, env: dict[str, str], log_file: Path):
        self.sandbox = sandbox
        self.log_file = log_file
        self._log = log_file.open("ab")
        self.exited_at: float | None = None
        self.run = asyncio.create_task(
            sandbox.exec(argv, cwd=cwd, env=env, inherit_env=False, on_output=self._write, service=True)
        )
        self.run.add_done_callback(self._ended)

    def _write(self, _stream: str, chunk: bytes) -> None:
        if not self._log.closed:
            self._log.write(chunk)
            self._log.flush()

    def _ended(self, _run: asyncio.Task[object]) -> None:
        self.exited_at = time.time()

    async def exit_code(self) -> int | None:
        if not self.run.done():
            return None
        if self.run.cancelled():
            return -9
        if (exc := self.run.exception()) is not None:
            self._write("stderr", f"\n[reroll: the service's exec failed: {exc}]\n".encode())
            return -1
        return self.run.result().exit_code

    async def run_command(self, command: str, timeout_seconds: float) -> tuple[bool, str]:
        result = await self.sandbox.exec(["sh", "-c", command], timeout_seconds=timeout_seconds)
        return result.exit_code == 0, _tail(result.output_text(), 3)

    async def output(self) -> bytes:
        self._log.flush()
        return self.log_file.read_bytes()

    async def stop(self) -> None:
        if not self.run.done():
            self.run.cancel()  # kills its process group
        with contextlib.suppress(asyncio.CancelledError, RerollError):
            await self.run
        self._log.close()


class Environment:
    """The task's services in one rollout; see the module docstring.

    Args:
        sandbox: the rollout's started sandbox.
        task: the task (its ``environment`` section).
        run_dir: the run folder; logs go to ``services/`` in it.
        env: the base environment of processes in the sandbox (PATH, the layout's variables, the
            task's ``environment.env``); each service gets it, its own ``env`` and `service_env`.
        environ: the host's environment (``forward_env``'s source) [default: os.environ].
    """

    def __init__(
        self,
        sandbox: Sandbox,
        task: Task,
        run_dir: Path,
        env: Mapping[str, str],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.task = task
        self.spec = task.spec.environment
        self.run_dir = run_dir
        self.env = dict(env)
        self.environ = os.environ if environ is None else environ
        self.records: dict[str, ServiceRecord] = {}
        self.processes: dict[str, ServiceProcess] = {}
        self._bring_up: asyncio.Task[None] | None = None
        self._deadline = 0.0
        self._last_seen: dict[str, str] = {}
        """What each probe answered last (quoted when it never passes)."""

    @property
    def declared(self) -> bool:
        """Whether the task declares anything of the environment plane to start or wait for."""
        readiness = self.spec.readiness
        return bool(
            self.spec.services
            or self.spec.owns_lifecycle
            or readiness.http
            or readiness.tcp
            or self.spec.healthcheck
        )

    def log_path(self, name: str) -> Path:
        """The host path of service `name`'s log: ``<run folder>/services/<name>.log``."""
        return RunPaths(self.run_dir).service_log(name)

    def forwarded_env(self) -> dict[str, str]:
        """The host variables ``forward_env`` names that are set, none named like a secret (the LLM
        proxy holds the provider keys: they never enter a sandbox)."""
        keys = [key for key in self.spec.forward_env.keys if not SECRET_NAME.search(key)]
        return {key: self.environ[key] for key in keys if key in self.environ}

    def service_env(self) -> dict[str, str]:
        """What every service (and the image's entrypoint) gets beyond the base environment: the
        forwarded variables and the task's selection variable."""
        env = self.forwarded_env()
        selection = self.spec.task_selection
        if selection is not None and selection.mechanism == "env_var":
            env[selection.key] = self.task.name
        return env

    def exec_env(self) -> dict[str, str]:
        """What the rollout's own processes in the sandbox (agent, oracle, verifier) get: the
        forwarded variables, and the selection variable when it is injected per ``exec``."""
        env = self.forwarded_env()
        selection = self.spec.task_selection
        if selection is not None and selection.mechanism == "env_var" and selection.inject_into == "exec":
            env[selection.key] = self.task.name
        return env

    async def provision(self) -> None:
        """Start bringing the services up in the background (each once its dependencies are
        healthy); the readiness deadline counts from now. Returns at once; `wait_ready` waits.

        Raises:
            TaskEnvironmentError: an image service on a backend without sibling containers.
        """
        self._deadline = time.monotonic() + self.spec.readiness.timeout_sec
        if not self.declared:
            return
        RunPaths(self.run_dir).services.mkdir(exist_ok=True)
        images = [service.name for service in self.spec.services if service.sibling]
        if images and not isinstance(self.sandbox, SiblingServices):
            raise TaskEnvironmentError(
                f"services {', '.join(images)} run an image: image services need the docker sandbox "
                "(this sandbox runs command services only)"
            )
        self._bring_up = asyncio.create_task(self._start_all())

    async def wait_ready(self) -> None:
        """Wait until every service and readiness probe passed (see the module docstring).

        Raises:
            ServiceNotReadyError: one exited first, or was not ready by the deadline (named, with
                its probe, the probe's last answer and its log's last lines).
            TaskEnvironmentError: a service could not be started at all.
        """
        if self._bring_up is None:
            return
        remaining = max(0.0, self._deadline - time.monotonic())
        try:
            await asyncio.wait_for(asyncio.shield(self._bring_up), remaining)
        except TimeoutError:
            self._bring_up.cancel()
            with contextlib.suppress(asyncio.CancelledError, RerollError):
                await self._bring_up
            raise await self._not_ready() from None
        finally:
            self._write_records()

    async def _start_all(self) -> None:
        """Start every service once its dependencies are ready, wait for each one's probe, then
        for the environment's own probes."""
        if self.spec.owns_lifecycle and isinstance(self.sandbox, SiblingServices):
            command = await self.sandbox.image_command()
            if command:
                probe = "[environment.readiness] and healthcheck"
                await self._start_process(ENTRYPOINT_SERVICE, shlex.join(command), None, {}, probe)
        ready: dict[str, asyncio.Event] = {service.name: asyncio.Event() for service in self.spec.services}

        async def bring_up(service: ServiceSpec) -> None:
            for name in service.depends_on:
                await ready[name].wait()
            if service.if_installed and not await self._installed(service):
                ready[service.name].set()  # what depends on it starts without it, as in BenchFlow
                return
            await self._start(service)
            await self._until_healthy(service.name, service.probe, service)
            self.records[service.name].ready_at = time.time()
            ready[service.name].set()

        try:
            async with asyncio.TaskGroup() as group:
                for service in start_order(self.spec.services):
                    group.create_task(bring_up(service))
        except BaseExceptionGroup as failed:  # the first failure; the others were cancelled
            raise failed.exceptions[0] from None
        self._none_installed()
        readiness = self.spec.readiness
        checks = [
            *(HealthCheck(http=url) for url in readiness.http),
            *(HealthCheck(http=f"tcp://localhost:{port}") for port in readiness.tcp),
            *([self.spec.healthcheck] if self.spec.healthcheck else []),
        ]
        for check in checks:
            await self._until_healthy("readiness", check, None, watch=ENTRYPOINT_SERVICE)

    async def _start(self, service: ServiceSpec) -> None:
        env = {**self.service_env(), **service.env}
        if not service.sibling:
            assert service.command is not None  # ServiceSpec's validator
            probe = service.describe_probe()
            await self._start_process(service.name, service.command, service.workdir, env, probe)
            return
        assert isinstance(self.sandbox, SiblingServices)
        self.records[service.name] = self._record(service.name, "image", service.describe_probe())
        self.processes[service.name] = await self.sandbox.start_sibling(service.name, env)

    async def _installed(self, service: ServiceSpec) -> bool:
        """Whether `service`'s program runs here (``PROGRAM --help`` exits 0 within
        `INSTALLED_PROBE_SECONDS`: BenchFlow's probe, which a console-script stub of a package the
        image lacks fails); if not, it is recorded as skipped."""
        assert service.command is not None  # a command service: ServiceSpec's validator
        program = _program(service.command)
        result = await self.sandbox.exec(
            ["sh", "-c", f"{shlex.quote(program)} --help >/dev/null 2>&1"],
            cwd=self.sandbox.layout.workspace,
            env={**self.env, **self.service_env(), **service.env},
            inherit_env=False,
            timeout_seconds=INSTALLED_PROBE_SECONDS,
        )
        if result.exit_code == 0:
            return True
        record = self._record(service.name, "command", service.describe_probe())
        record.skipped = f"{program} --help exited {result.exit_code}: not installed in this sandbox"
        self.records[service.name] = record
        log.info("service %s skipped: %s", service.name, record.skipped)
        return False

    def _none_installed(self) -> None:
        """Raise when the task declares services to start where installed and none was (BenchFlow:
        the manifest and the image disagree entirely).

        Raises:
            TaskEnvironmentError: naming the programs probed.
        """
        probed = [service for service in self.spec.services if service.if_installed]
        if probed and all(self.records[service.name].skipped for service in probed):
            programs = ", ".join(_program(service.command or "") for service in probed)
            raise TaskEnvironmentError(
                f"none of the environment's {len(probed)} service(s) is installed in this sandbox "
                f"(probed with --help: {programs}): the manifest's service commands do not match the image"
            )

    async def _start_process(
        self, name: str, command: str, workdir: str | None, env: dict[str, str], probe: str
    ) -> None:
        self.records[name] = self._record(name, "command", probe)
        self.processes[name] = _ExecService(
            self.sandbox,
            ["sh", "-c", command],
            workdir or self.sandbox.layout.workspace,
            {**self.env, **self.service_env(), **env},
            self.log_path(name),
        )

    def _record(self, name: str, runs: str, probe: str) -> ServiceRecord:
        log_file = self.log_path(name)
        log_file.touch()
        return ServiceRecord(
            name=name,
            runs="image" if runs == "image" else "command",
            probe=probe,
            log=str(log_file.relative_to(self.run_dir)),
            started_at=time.time(),
        )

    async def _until_healthy(
        self, name: str, probe: HealthCheck | None, service: ServiceSpec | None, watch: str = ""
    ) -> None:
        """Probe until `probe` passes; raise ServiceNotReadyError when the service `watch` (default:
        `name`) exits first — but for the image's entrypoint exiting 0 (it started its daemons
        and left). No probe: ready once it runs (not exited at the first look)."""
        watch = watch or name
        process = self.processes.get(watch)
        while True:
            if process is not None and (code := await process.exit_code()) is not None:
                if watch == ENTRYPOINT_SERVICE and code == 0:
                    process = None
                    continue
                self._exited(watch, code)
                raise ServiceNotReadyError(
                    await self._describe(watch, f"exited with code {code} before it was ready")
                )
            if probe is None:
                return
            healthy, seen = await self._probe(probe, service, process)
            self._last_seen[name] = seen or "failed, without output"
            if name == "readiness":
                self._last_seen[name] = f"{probe.describe()}: {self._last_seen[name]}"
            if healthy:
                return
            await asyncio.sleep(probe.interval_sec)

    async def _probe(
        self, probe: HealthCheck, service: ServiceSpec | None, process: ServiceProcess | None
    ) -> tuple[bool, str]:
        """Run `probe` once: its command where the service runs, its URL by the sidecar's probe."""
        timeout = probe.timeout_sec
        if probe.command is not None:
            if process is not None and service is not None and service.sibling:
                return await process.run_command(probe.command, timeout)
            result = await self.sandbox.exec(
                ["sh", "-c", probe.command], env=self.env, inherit_env=False, timeout_seconds=timeout
            )
            return result.exit_code == 0, _tail(result.output_text(), 3)
        target = probe.http or ""
        if target.startswith("/") and service is not None:
            target = f"http://{service.name if service.sibling else 'localhost'}:{service.port}{target}"
        result = await self.sandbox.exec(
            [*self.probe_command(), "probe", target, "--timeout", f"{timeout:g}"],
            env=self.env,
            inherit_env=False,
            timeout_seconds=timeout + 5,
        )
        return result.exit_code == 0, _tail(result.output_text(), 3)

    def probe_command(self) -> list[str]:
        """The sidecar's program in the sandbox (its ``probe`` command probes URLs and ports):
        the backend's ``sidecar_program`` (`reroll.sandbox.base.Sandbox`), else
        the bundle's path."""
        return list(getattr(self.sandbox, "sidecar_program", ENTRYPOINT))

    def _exited(self, name: str, code: int) -> None:
        record = self.records[name]
        if record.exited_at is None:
            record.exited_at, record.exit_code = time.time(), code

    async def _describe(self, name: str, what: str) -> str:
        """A failure of service `name`: what happened, its probe, the probe's last answer, its log's end."""
        record = self.records.get(name)
        probe = record.probe if record is not None else "?"
        seen = self._last_seen.get(name)
        last = f"; the probe's last answer: {seen}" if seen else ""
        output = await self.processes[name].output() if name in self.processes else b""
        tail = _tail(output.decode(errors="replace"), LOG_TAIL_LINES) or "(empty)"
        where = record.log if record is not None else f"{SERVICES_DIR}/{name}.log"
        return f"service {name} {what} (probe: {probe}{last}); the last lines of {where}:\n{tail}"

    async def _not_ready(self) -> ServiceNotReadyError:
        """The error for a gate that timed out: the first service (in start order) not ready."""
        timeout = self.spec.readiness.timeout_sec
        for name, record in self.records.items():
            if record.ready_at is None and name != ENTRYPOINT_SERVICE:
                return ServiceNotReadyError(await self._describe(name, f"was not ready within {timeout:g} s"))
        pending = [s.name for s in self.spec.services if s.name not in self.records]
        if pending:
            return ServiceNotReadyError(
                f"services {', '.join(pending)} did not start within {timeout:g} s: "
                "what they depend on was not ready"
            )
        seen = self._last_seen.get("readiness", "")
        text = await self._describe(ENTRYPOINT_SERVICE, "") if ENTRYPOINT_SERVICE in self.processes else ""
        return ServiceNotReadyError(
            f"the environment was not ready within {timeout:g} s: [environment.readiness] / healthcheck "
            f"probe failing: {seen or 'no answer yet'}" + (f"\n{text}" if text else "")
        )

    async def check_alive(self) -> None:
        """Raise when a service exited since it was ready (the agent ran on a broken world).

        Raises:
            ServiceCrashedError: naming the first such service, its exit code and its log's end.
        """
        for name, process in self.processes.items():
            code = await process.exit_code()
            if code is None or (name == ENTRYPOINT_SERVICE and code == 0):
                continue
            self._exited(name, code)
            self._write_records()
            what = f"crashed while the agent ran (exit code {code})"
            raise ServiceCrashedError(await self._describe(name, what))

    async def teardown(self) -> None:
        """Stop every service (siblings removed), write the siblings' logs and ``services.json``.
        Always safe: also after a failed provision, and twice."""
        if self._bring_up is not None and not self._bring_up.done():
            self._bring_up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._bring_up
        for name, process in reversed(self.processes.items()):
            try:
                if not isinstance(process, _ExecService):
                    self.log_path(name).write_bytes(await process.output())
                await process.stop()
            except (RerollError, OSError) as exc:
                log.warning("stopping service %s failed: %s", name, exc)
        self.processes = {}
        self._write_records()

    def _write_records(self) -> None:
        if self.records:
            write_json(
                RunPaths(self.run_dir).services_record,
                [r.model_dump(mode="json") for r in self.records.values()],
            )


def _program(command: str) -> str:
    """The program a service's shell line starts: its first word (BenchFlow's), after ``exec``."""
    words = command.split()
    return words[1] if len(words) > 1 and words[0] == "exec" else (words or [""])[0]


def _tail(text: str, lines: int) -> str:
    """The last `lines` non-empty lines of `text`, at most `LOG_TAIL_CHARS` characters."""
    kept = "\n".join([line for line in text.splitlines() if line.strip()][-lines:])
    return kept if len(kept) <= LOG_TAIL_CHARS else "…" + kept[-LOG_TAIL_CHARS:]
