"""The ``ray`` executor: each attempt of a rollout is one Ray task (``reroll job --executor ray``).

Imported only when that executor is chosen (`reroll.jobs.executors.create_executor`); needs
``pip install 'reroll[ray]'``.

- Cluster: with no ``ray_address`` (``--ray-address``, else ``$RAY_ADDRESS``) a local Ray instance
  is started for the job (``ray.init(address="local", num_cpus=concurrency)``: one logical CPU per
  rollout slot, since a rollout mostly waits on its agent) and shut down after it; with an address
  (``auto``, ``HOST:6379``, ``ray://host:10001``) the job joins that cluster and leaves it running.
  Every node needs reroll installed (same reroll and ray version, same Python minor version) and
  what its sandbox backend needs (e.g. Docker for ``docker``); no file system is shared.
- What travels, always (a local instance too, so one code path is tested): the folders and files
  an attempt reads (`Attempt.folders_read`: its task folder; for a continuation or branch the
  recorded run and its task; the ``--skills-dir`` folder, a continuation's learner store, a
  ``scripted:PATH`` model's or judge's script file) are packed once per job
  (`reroll.jobs.folder_archive`, gzip'd tar with a content hash; a link out of a folder, or a
  link or special file named as a file, is refused), put in Ray's object store, and unpacked on a
  worker into ``<cache>/ray/folders/<hash>/`` (fetched only when that folder is missing, and kept
  for later jobs; a file lies in it under its own name). The attempt runs in a fresh scratch
  folder ``<cache>/ray/runs/<random>/`` with its path arguments rebound there (`relocated`: those
  in its `reroll.rollout.start.RolloutSettings` and its model spec too); when it ends, the
  worker's paths in its config.json are replaced by the controller's (`restore_paths`), so the
  run folder names the task, skills and scripts as they are on the controller, and the run
  folder is packed and returned with its result, unpacked at the attempt's run folder in the
  controller's jobs dir, and the scratch folder deleted. So a lost node loses only its in-flight
  rollouts. The controller's ``$REROLL_AGENTS_FILE`` (agents declared as data) travels the same
  way and is the worker's for the task, so the agents the controller planned with are the ones
  that run. Nothing else travels: agents install on each node into its own cache, docker images
  are built on each node, API keys come from each node's environment.
- What cannot travel is refused before the job starts (`reroll.jobs.runner`): a
  ``sequential-shared`` job (each rollout writes the store the next one starts from, on the
  controller), and a continuation or branch of a trial whose User is a file
  (``path/to/file.py:attr``; importable modules work when installed on every node).
- Each task asks for 1 CPU, so a node runs at most as many rollouts as it has CPUs; the
  controller keeps at most ``concurrency`` tasks in flight. ``max_starting`` is not applied:
  a Ray worker runs one rollout at a time, and the cluster's CPUs bound what starts at once.
- Retries: Ray's own retries are off (``max_retries=0``); a task Ray lost (its worker or node
  died: `ray.exceptions.WorkerCrashedError`, `ray.exceptions.NodeDiedError`, a lost object, ...)
  becomes an `InfrastructureError`, which the job's loop retries with backoff like any
  infrastructure failure; nothing of that attempt's run folder comes back. An exception raised by
  the attempt inside the task (bad input found late) is re-raised as it is, as with the asyncio
  executor, after its partial run folder came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
import ray
import ray.exceptions
from reroll_contracts.errors import InfrastructureError

from reroll.agents import AGENTS_FILE_ENV, registry
from reroll.cache import cache_dir
from reroll.jobs.executors import Attempt
from reroll.jobs.folder_archive import pack, pack_file, unpack
from reroll.jobs.jobfile import RunnerOptions
from reroll.models.spec import script_file, with_script_file
from reroll.rollout.start import RolloutOutcome
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import RunResult, write_json
from reroll.settings import RolloutSettings


@dataclasses.dataclass(frozen=True)
class ShippedFolder:
    """A folder (or a file, packed as a folder holding it) an attempt reads, in Ray's object store."""

    source: Path
    """Where it is on the controller (the path the attempt's arguments name)."""
    digest: str
    """Its content hash (`reroll.jobs.folder_archive.PackedFolder.digest`): its cache key on a worker."""
    data: Any
    """The `ray.ObjectRef` of its packed bytes; a worker fetches it only on a cache miss."""
    file: bool = False
    """True: `source` is a file (`reroll.jobs.folder_archive.pack_file`), named in the folder as it is."""


@dataclasses.dataclass(frozen=True)
class Returned:
    """What a Ray task sends back: the attempt's result or error, and its run folder packed."""

    result: RunResult | None
    """result.json of the run folder; None when the attempt raised."""
    error: Exception | None
    """What the attempt raised (bad input found late, or a bug), re-raised on the controller."""
    run_folder: bytes | None
    """The run folder (`reroll.jobs.folder_archive.pack`), None if the attempt made none."""


def worker_root() -> Path:
    """``<cache>/ray`` on a worker: ``folders/<hash>/`` (unpacked inputs), ``runs/`` (scratch)."""
    return cache_dir() / "ray"


def relocated(attempt: Attempt, folders: dict[Path, Path], scratch: Path, tasks_dir: Path | None) -> Attempt:
    """`attempt` with its path arguments rebound for a worker: a path inside a folder of `folders`
    (controller path → worker path; a file's maps to the file) moves with it, the run folder and its
    parents move under `scratch` (``/jobs/x`` → ``scratch/jobs/x``), ``tasks_dir`` becomes
    `tasks_dir` if given, and any other path stays as it is (the attempt then fails on it, naming
    it, as it would in-process: a folder that could not be packed). The same holds for the paths
    in an ``options`` argument (`reroll.rollout.start.RolloutSettings.relocated`) and for the
    script of a ``model`` argument (``scripted:PATH``).
    """
    call = attempt.run
    assert isinstance(call, functools.partial)
    outputs = (attempt.run_dir, *attempt.run_dir.parents)

    def moved(value: Path) -> Path:
        for source, target in folders.items():
            if value.is_relative_to(source):
                return target / value.relative_to(source)
        if value in outputs:
            return scratch / value.relative_to(value.anchor)
        return value

    def argument(value: object) -> object:
        return moved(value) if isinstance(value, Path) else value

    keywords = {key: argument(value) for key, value in call.keywords.items()}
    if isinstance(options := keywords.get("options"), RolloutSettings):
        keywords["options"] = options.relocated(moved)
    if isinstance(model := keywords.get("model"), str) and (script := script_file(model)) is not None:
        keywords["model"] = with_script_file(model, moved(script))
    if tasks_dir is not None:
        keywords["tasks_dir"] = tasks_dir
    run = functools.partial(call.func, *map(argument, call.args), **keywords)
    return dataclasses.replace(attempt, run_dir=moved(attempt.run_dir), run=run)


def _cached(folder: ShippedFolder, root: Path) -> Path:
    """The worker's copy of `folder`: ``root/<digest>`` (a file: the file in it), unpacked from the
    object store if missing."""
    target = root / folder.digest
    if not target.is_dir():
        with contextlib.suppress(FileExistsError):  # another worker of this node unpacked it meanwhile
            unpack(ray.get(folder.data), target, source=str(folder.source))
    return target / folder.source.name if folder.file else target


def restore_paths(config: Path, folders: dict[Path, Path], scratch: Path) -> None:
    """Rewrite the run folder's config.json at `config` with the controller's paths: every worker
    path of `folders` (controller path → worker path, `relocated`) in its string values becomes the
    controller's, and a path under `scratch` the path it stands for (``scratch/jobs/x`` →
    ``/jobs/x``). A missing or unreadable config.json is left as it is (the run folder is then
    incomplete, and says so on the controller).
    """
    try:
        data = orjson.loads(config.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return
    pairs = [(str(worker), str(source)) for source, worker in folders.items()] + [(str(scratch), "")]

    def restored(value: object) -> object:
        if isinstance(value, str):
            for worker, source in pairs:
                value = value.replace(worker, source)
            return value
        if isinstance(value, list):
            return [restored(item) for item in value]
        if isinstance(value, dict):
            return {key: restored(item) for key, item in value.items()}
        return value

    write_json(config, restored(data))  # type: ignore[arg-type]  # a JSON object stays one


@contextlib.contextmanager
def _agents_declared_in(file: Path | None) -> Iterator[None]:
    """Within the block, the agent registry reads ``$REROLL_AGENTS_FILE`` = `file` (the
    controller's declarations, carried here), as the controller's did when it planned the job;
    the worker's own value is back after it. None: the worker's own, untouched."""
    if file is None:
        yield
        return
    before = os.environ.get(AGENTS_FILE_ENV)
    os.environ[AGENTS_FILE_ENV] = str(file)
    registry.cache_clear()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(AGENTS_FILE_ENV, None)
        else:
            os.environ[AGENTS_FILE_ENV] = before
        registry.cache_clear()


def _run_in_worker(attempt: Attempt, inputs: list[ShippedFolder], agents: ShippedFolder | None) -> Returned:
    """The Ray task's body: fetch the inputs (and the controller's ``$REROLL_AGENTS_FILE``,
    `agents`), run the attempt in a scratch folder in a fresh event loop of the worker process,
    and send its run folder back."""
    root = worker_root()
    (root / "runs").mkdir(parents=True, exist_ok=True)
    folders = {folder.source: _cached(folder, root / "folders") for folder in inputs}
    agents_file = _cached(agents, root / "folders") if agents is not None else None
    with (
        tempfile.TemporaryDirectory(prefix="run-", dir=root / "runs", ignore_cleanup_errors=True) as name,
        _agents_declared_in(agents_file),
    ):
        scratch = Path(name)
        tasks_dir = None
        if attempt.recorded_task is not None and attempt.recorded_task.path in folders:
            tasks_dir = scratch / "tasks"
            tasks_dir.mkdir()
            (tasks_dir / Path(attempt.recorded_task.name).name).symlink_to(
                folders[attempt.recorded_task.path]
            )
        local = relocated(attempt, folders, scratch, tasks_dir)

        async def main() -> RolloutOutcome:
            return await local.run(start_gate=None)

        result, error = None, None
        try:
            result = asyncio.run(main()).result
        except Exception as exc:  # re-raised on the controller, after the run folder came back
            error = exc
        restore_paths(RunPaths(local.run_dir).config, folders, scratch)
        run_folder = pack(local.run_dir).data if local.run_dir.is_dir() else None
        return Returned(result, error, run_folder)


def _init_failure(address: str | None, exc: Exception) -> str:
    """Why ``ray.init`` failed, for an `InfrastructureError`: a local instance that did not start,
    or the cluster at `address` that could not be joined; with ``$RAY_ADDRESS`` when it is set
    (Ray itself reads it too) and the exception's type and message."""
    where = (
        "cannot start a local Ray instance"
        if address is None
        else f"cannot join the Ray cluster at {address}"
    )
    env = os.environ.get("RAY_ADDRESS")
    cause = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    return f"Ray: {where}" + (f" (RAY_ADDRESS={env})" if env else "") + f": {cause}"


class RayExecutor:
    """Runs attempts as Ray tasks; see the module docstring."""

    def __init__(self, options: RunnerOptions) -> None:
        self._options = options
        self._slots = asyncio.Semaphore(options.concurrency)
        self._started_ray = False
        self._remote: Any = None
        self._shipped: dict[Path, asyncio.Task[ShippedFolder | None]] = {}

    async def __aenter__(self) -> RayExecutor:
        """Start a local Ray instance (or join ``ray_address``).

        Raises:
            InfrastructureError: Ray could not start or the cluster could not be reached (any
                exception of ``ray.init``, e.g. a node that timed out during start-up); the
                message names the address, ``$RAY_ADDRESS`` if set, and the cause.
        """
        if not ray.is_initialized():
            address = self._options.ray_address
            local = address is None
            try:
                ray.init(
                    address="local" if local else address,
                    num_cpus=self._options.concurrency if local else None,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except (
                Exception
            ) as exc:  # a start-up timeout is a bare Exception ("... timed out during startup")
                raise InfrastructureError(_init_failure(address, exc)) from exc
            self._started_ray = True
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_run_in_worker)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Shut the Ray instance down if this executor started it."""
        self._shipped.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    async def _ship(self, folder: Path) -> ShippedFolder | None:
        """`folder` (or a file) packed and put in the object store, once per job; None when it
        cannot be read (the attempt then fails on it on the worker, naming it, as it would
        in-process).

        Raises:
            JobError: `folder` holds a link out of it; a file is a link or a special file.
        """
        if folder not in self._shipped:
            self._shipped[folder] = asyncio.create_task(self._put(folder))
        return await self._shipped[folder]

    @staticmethod
    async def _put(path: Path) -> ShippedFolder | None:
        file = path.is_file() or path.is_symlink()  # a link named as a file is refused by pack_file
        try:
            packed = await asyncio.to_thread(pack_file if file else pack, path)
        except OSError:
            return None
        return ShippedFolder(path, packed.digest, ray.put(packed.data), file)

    async def run(self, attempt: Attempt) -> RolloutOutcome:
        """Run `attempt` as a Ray task once fewer than ``concurrency`` are in flight, its inputs
        shipped to the worker and its run folder shipped back to ``attempt.run_dir``.

        Raises:
            InfrastructureError: Ray lost the task (worker or node died, task cancelled).
            JobError: a folder the attempt reads cannot travel (a link out of it); raised inside the
                task when its run folder holds one.
            RunFolderError: the run folder came back unsafe (a member out of it).
            Exception: whatever the attempt itself raised, unwrapped.
        """
        async with self._slots:
            inputs = [shipped for folder in attempt.folders_read if (shipped := await self._ship(folder))]
            declared = os.environ.get(AGENTS_FILE_ENV)
            agents = await self._ship(Path(declared).resolve()) if declared else None
            ref = self._remote.remote(attempt, inputs, agents)
            try:
                returned: Returned = await ref
            except asyncio.CancelledError:
                ray.cancel(ref, force=True)  # the worker dies; its rollout's children die with it
                raise
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, Exception):
                    raise exc.cause from None
                raise InfrastructureError(f"{attempt.run_dir.name}: Ray task failed: {exc}") from exc
            except ray.exceptions.RayError as exc:
                raise InfrastructureError(f"{attempt.run_dir.name}: Ray lost the task: {exc}") from exc
            if returned.run_folder is not None:
                data = returned.run_folder
                await asyncio.to_thread(
                    unpack, data, attempt.run_dir, source=f"Ray task {attempt.run_dir.name}"
                )
            if returned.error is not None:
                raise returned.error
            assert returned.result is not None
            return RolloutOutcome(attempt.run_dir, returned.result)
