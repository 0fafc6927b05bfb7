"""Verification with hardening (the PrepareVerify and Verify RPCs): undo what an agent may have
planted to game the score, then run the verifier's test script and read its reward.

`Verifier.prepare`, before the agent runs, records the Python start-up hooks that exist
(``conftest.py``, ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``) under the workspace, the
agent's HOME and, in a container (an agent user is set), the scratch folders and the site
directories of the sandbox's ``python3``; it snapshots them with the workspace's build-config
files, and records that ``python3``'s trusted pytest plugins (`pytest_plugins.scan`).
`Verifier.verify` then:

1. quiesces the agent (`quiesce`: freezes, then kills, every process of the agent's user and
   every descendant Exec started, until a scan finds none), then kills every Exec process group
   — all but the task's services (``ExecRequest.service``) and what they forked, identified as
   the sidecar spawned them (`processes.ProcessGroups.services`), so the test script can query
   a live service; a service still dies with the agent's user's processes if it runs as them.
   With ``VerifyRequest.keep_agent_processes`` (Harbor's semantics) they are only frozen, and go
   on after step 3, the workspace first handed to root when an agent user is set (`quiesce.let_go`);
2. restores that snapshot: build-config edits are undone, build-config files the agent created
   are deleted, the recorded hooks are put back, owned by root; a folder on the way that the
   agent replaced by a symlink is replaced by a real folder, never followed (`nofollow`);
3. deletes every start-up hook that was not there before (never through a symlinked folder), and
   scans the pytest plugins again (`pytest_plugins.allowed` decides which load);
4. deletes old reward files and runs the test script as the sidecar's user (root in a container),
   from the image's WORKDIR (``VerifyRequest.cwd``, as Harbor runs it; else the verifier's folder)
   in a clean environment: the image's own ENV (``image_env``, kept whole) under the request's,
   the request's without PYTHONPATH and the like, no user site, HOME of the sidecar's user
   in a container, ``PYTEST_ADDOPTS="-c /dev/null --rootdir=<cwd> --confcutdir=<verifier dir>
   -p no:cacheprovider"`` (``-c`` names the pytest configuration shipped with the tests instead,
   when there is one: `shipped_pytest_config`)
   and plugin autoloading off, the allowed plugins passed as ``-p NAME``: the task's declared ones
   and the image's root-owned ones present before the agent ran (`pytest_plugins`); a timeout
   kills the script's whole process group. With the sidecar as root (docker, the local sandbox),
   the script runs in namespaces of its own (`verify_ns`, where they can be made) and gets
   ``REROLL_GUARD`` (`guard`); with ``own_network`` in a loopback-only network namespace too, or
   not at all (a reward error);
5. reads ``reward.txt`` (one float) or ``reward.json`` (an object of numbers, maybe beside the
   structured form's items, events, space and granularity, or BenchFlow's graded form: metrics
   and an aggregate, `reroll_contracts.graded`);
6. when a guarded run (`guard`: the script called ``$REROLL_GUARD``, set when the sidecar is
   root) came back tampered with (a canary's outcome wrong), clears the rewards: a reward error;
   with ``pytest_report``, trusts pytest's own report over the script's exit status: a pytest that
   started and wrote no report zeroes every reward, one whose report counts failures or errors
   zeroes the rewards above the share of tests that passed (`pytest_report`);
7. kills every process the script left (`quiesce`, as in step 1). A soft verify in a sandbox of
   its own (an agent user is set) is fenced instead (`fence`: entered before the script, left
   after it): its processes are killed, the agent's folders restored, new files elsewhere
   deleted, and what cannot be undone is returned as ``VerifyResult.leftover``.

Steps 2, 3, 6 and the pytest variables can each be turned off per task (`pb.Hardening`); a soft
verify (``VerifyRequest.soft``: between the rounds of a trial, the agent working on afterwards)
skips steps 2 and 3. Steps 1 to 3 together have a time limit (`Verifier.harden_timeout_seconds`);
when they fail or run out of time, the script does not run and the result carries a reward error
(a verifier error for the controller, never a retried infrastructure error); the report's notes
say why.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import pwd
import shlex
import stat
from collections.abc import AsyncGenerator, Callable, Iterable, MutableSequence
from dataclasses import dataclass, field

from reroll_contracts.errors import QuiesceError, SnapshotError, ToolError, VerifyError
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb

from reroll_sidecar import (
    fence,
    guard,
    nofollow,
    processes,
    pytest_plugins,
    pytest_report,
    quiesce,
    verify_ns,
)
from reroll_sidecar.rewards import (
    MAX_REWARD_BYTES,
    delete_old_rewards,
    policy_from_message,
    read_rewards,
)
from reroll_sidecar.snapshots import SnapshotStore

BASELINE_SNAPSHOT = "reroll-pre-agent"
BUILD_CONFIG_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "pytest.ini", ".pytest.ini", "tox.ini")
"""Workspace files (top level) restored to their pre-agent state."""
HOOK_FILES = ("conftest.py", "sitecustomize.py", "usercustomize.py")
"""Start-up hooks by name; every ``*.pth`` file is one too."""
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
"""Scanned for hooks in a container, where the agent can write there."""
SKIPPED_DIRS = (".git", "node_modules")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The test script's PATH when the request sets none."""
UNSAFE_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTEST_PLUGINS")
"""Removed from the test script's environment."""
HARDEN_TIMEOUT_SECONDS = 120.0
"""The time limit of steps 1 to 3 (quiesce, restore, hook deletion, plugin scan) together."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Baseline:
    """What `Verifier.prepare` recorded before the agent ran."""

    hardening: pb.Hardening
    agent_user: str
    roots: list[str]
    """Folders walked for start-up hooks."""
    site_dirs: list[str]
    """Folders listed (not walked) for start-up hooks."""
    hooks: list[str] = field(default_factory=list)
    snapshot_paths: list[str] = field(default_factory=list)
    plugins: pytest_plugins.Scan = field(default_factory=pytest_plugins.Scan)
    """The sandbox's ``python3`` before the agent ran (its pytest plugins, its site directories)."""


def _is_hook(name: str) -> bool:
    return name in HOOK_FILES or name.endswith(".pth")


def _read_only(path: str) -> bool:
    """Whether `path` lies on a read-only mount (the system folders of the isolated local
    sandbox): no process of the sandbox can change it, so it needs no snapshot."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def trusted_folder(path: str, folders: Iterable[str]) -> str:
    """The deepest of `folders` that holds `path` (where the agent's tree begins), else `path`'s folder."""
    holding = [os.path.normpath(f) for f in folders if os.path.commonpath([f, path]) == os.path.normpath(f)]
    holding = [f for f in holding if f != os.path.normpath(path)]
    return max(holding, key=len) if holding else os.path.dirname(path)


def find_hooks(roots: Iterable[str], site_dirs: Iterable[str]) -> list[str]:
    """The start-up hook files under `roots` (walked, skipping `SKIPPED_DIRS`, symlinked folders
    not followed) and directly in `site_dirs`, as sorted absolute paths."""
    found: set[str] = set()
    for root in roots:
        for base, dirs, files in os.walk(root):
            dirs[:] = [name for name in dirs if name not in SKIPPED_DIRS]
            found.update(os.path.join(base, name) for name in files if _is_hook(name))
    for folder in site_dirs:
        with contextlib.suppress(OSError):
            found.update(os.path.join(folder, name) for name in os.listdir(folder) if _is_hook(name))
    return sorted(found)


PYTEST_CONFIG_FILES = (
    ("pytest.ini", ""),
    (".pytest.ini", ""),
    ("pyproject.toml", "[tool.pytest.ini_options]"),
    ("tox.ini", "[pytest]"),
    ("setup.cfg", "[tool:pytest]"),
)
"""pytest's configuration files in the order it looks for them, each with the section that makes
it one (empty: the file is one whatever it holds)."""


def shipped_pytest_config(verifier_dir: str) -> str | None:
    """The pytest configuration file shipped with the tests in `verifier_dir` (the task's, put
    there after the agent stopped), as pytest would pick it there; None when there is none. The
    hardened ``PYTEST_ADDOPTS`` names it with ``-c`` (else ``/dev/null``), so no file the agent
    wrote configures pytest, and the tests' own one does."""
    for name, section in PYTEST_CONFIG_FILES:
        path = os.path.join(verifier_dir, name)
        try:
            with open(path, "rb") as handle:
                head = handle.read(MAX_REWARD_BYTES)
        except OSError:
            continue
        if not section or section.encode() in head:
            return path
    return None


def _absolute(value: str, what: str) -> str:
    if not os.path.isabs(value):
        raise VerifyError("invalid", f"{what} must be an absolute path, not {value!r}")
    return value


def _agent_uid(baseline: Baseline) -> int | None:
    """The agent's user id when it is another user than root and the sidecar's, else None.

    Raises:
        VerifyError: ``failed`` when the agent user is unknown.
    """
    if not baseline.agent_user:
        return None
    try:
        uid = pwd.getpwnam(baseline.agent_user).pw_uid
    except KeyError:
        raise VerifyError("failed", f"unknown agent user {baseline.agent_user!r}") from None
    return None if uid in (0, os.geteuid()) else uid


def _read_result(
    request: pb.VerifyRequest,
    reward_dir: str,
    exit_status: pb.ExecExit,
    folder: pytest_report.ReportFolder | None,
    guarded: guard.GuardFolder | None,
) -> pb.VerifyResult:
    """Steps 5 and 6 of the module docstring: the script's rewards (none after a timeout), capped
    by pytest's report (`folder`) and cleared by a tampered guarded run (`guarded`)."""
    policy = policy_from_message(request.aggregate_policy) if request.HasField("aggregate_policy") else None
    result = pb.VerifyResult() if exit_status.timed_out else read_rewards(reward_dir, policy)
    if folder is not None and not exit_status.timed_out:
        judgement = pytest_report.judge(folder.path)
        result.pytest_report = judgement.note
        for key in result.rewards:
            result.rewards[key] = judgement.capped(result.rewards[key])
    if guarded is not None:
        guarded.apply(result)
    result.exit_code, result.timed_out = exit_status.exit_code, exit_status.timed_out
    return result


class Verifier:
    """Holds the baseline between PrepareVerify and Verify; see the module docstring.

    Args:
        groups: the Exec process groups (killed before the script runs; the script's joins them).
        snapshots: where the baseline snapshot is kept.
        harden_timeout_seconds: the time limit of steps 1 to 3 together.
    """

    def __init__(
        self,
        groups: processes.ProcessGroups,
        snapshots: SnapshotStore,
        harden_timeout_seconds: float = HARDEN_TIMEOUT_SECONDS,
    ) -> None:
        self.groups = groups
        self.snapshots = snapshots
        self.harden_timeout_seconds = harden_timeout_seconds
        self.baseline: Baseline | None = None

    async def prepare(self, request: pb.PrepareVerifyRequest) -> Baseline:
        """Record the hooks and snapshot them with the build-config files, and scan the pytest
        plugins (unless the task autoloads them); replaces the baseline.

        Raises:
            VerifyError: ``invalid`` for a relative path, ``failed`` when a scan or the snapshot failed.
        """
        workspace = _absolute(request.workspace, "workspace")
        roots = [workspace, _absolute(request.home, "home")]
        options = request.hardening
        in_container = bool(request.agent_user)
        if in_container:
            roots += SCRATCH_DIRS
        scan = pytest_plugins.Scan()
        env = {"PATH": DEFAULT_PATH, **request.env}
        if options.delete_injected_hooks and in_container:  # its site directories are needed
            scan = await pytest_plugins.scan(env)
        elif not options.plugin_autoload:
            scan = await pytest_plugins.scan_or_error(env)
        site_dirs = scan.site_dirs if options.delete_injected_hooks and in_container else []
        hooks: list[str] = []
        if options.delete_injected_hooks:
            hooks = await asyncio.to_thread(find_hooks, roots, site_dirs)
        paths = (
            [os.path.join(workspace, name) for name in BUILD_CONFIG_FILES]
            if options.restore_build_config
            else []
        )
        paths += [path for path in hooks if not _read_only(path)]  # nothing can change those
        if paths:
            trusted = {path: trusted_folder(path, [*roots, *site_dirs]) for path in paths}
            try:
                await self.snapshots.save(BASELINE_SNAPSHOT, paths, trusted)
            except SnapshotError as exc:
                raise VerifyError("failed", f"snapshotting the verification baseline: {exc}") from exc
        self.baseline = Baseline(options, request.agent_user, roots, site_dirs, hooks, paths, scan)
        log.info(
            "verification baseline: %d hooks, %d paths snapshotted, pytest plugins %s",
            len(hooks),
            len(paths),
            sorted(scan.trusted),
        )
        return self.baseline

    async def verify(self, request: pb.VerifyRequest) -> AsyncGenerator[pb.VerifyEvent, None]:
        """Harden, run the test script, read the reward; yields the hardening report first, then
        the script's output as produced, then the result.

        Raises:
            VerifyError: ``precondition`` without a baseline, ``invalid`` for a relative path,
                ``not_found`` when the script is missing, ``failed`` when the restore failed.
        """
        baseline = self.baseline
        if baseline is None:
            raise VerifyError(
                "precondition", "no verification baseline: PrepareVerify must run before the agent"
            )
        verifier_dir = _absolute(request.verifier_dir, "verifier_dir")
        reward_dir = _absolute(request.reward_dir, "reward_dir")
        script = os.path.join(verifier_dir, request.script or "test.sh")
        if not os.path.isfile(script):
            raise VerifyError("not_found", f"the verifier's test script {script} is missing")
        report = pb.HardeningReport()
        if request.own_network and (refused := await asyncio.to_thread(verify_ns.refusal, True)):
            note = f"the verifier's network policy none cannot be enforced, its script was not run: {refused}"
            yield pb.VerifyEvent(hardening=pb.HardeningReport(notes=[note]))
            yield pb.VerifyEvent(result=pb.VerifyResult(reward_error=note))
            return
        plugins = await self._harden_in_time(baseline, report, request)
        yield pb.VerifyEvent(hardening=report)
        if plugins is None:
            yield pb.VerifyEvent(result=pb.VerifyResult(reward_error=report.notes[-1]))
            return
        if error := delete_old_rewards(reward_dir):
            yield pb.VerifyEvent(result=pb.VerifyResult(reward_error=error))
            return
        os.chmod(script, stat.S_IMODE(os.stat(script).st_mode) | 0o111)
        fenced, error = await self._enter_fence(baseline, request, verifier_dir, reward_dir)
        if error:
            yield pb.VerifyEvent(result=pb.VerifyResult(reward_error=error))
            return
        options = baseline.hardening
        with contextlib.ExitStack() as stack:
            folder = None
            private = self._private_folder()
            if options.pytest_addopts and options.pytest_report:
                folder = stack.enter_context(pytest_report.ReportFolder(private))
            as_root = os.geteuid() == 0  # docker's and the local sandbox's sidecar (a root agent's too)
            guarded = stack.enter_context(guard.GuardFolder(private)) if as_root else None
            cwd = request.cwd if os.path.isabs(request.cwd) and os.path.isdir(request.cwd) else verifier_dir
            env = self._script_env(baseline, request, folder, plugins, cwd)
            if guarded is not None:
                env["REROLL_GUARD"] = guarded.launcher
            exit_status = pb.ExecExit()
            namespaces = await asyncio.to_thread(verify_ns.refusal, request.own_network)
            fresh_tmp = request.soft and not verify_ns.under_fresh_tmp(
                [verifier_dir, reward_dir, cwd, private, *baseline.roots[:1]]
            )
            launch = functools.partial(verify_ns.command, fresh_tmp=fresh_tmp, own_net=request.own_network)
            async for event in self._run_script(
                script, cwd, env, request.timeout_seconds, None if namespaces else launch
            ):
                if isinstance(event, pb.ExecExit):
                    exit_status = event
                else:
                    yield event
            result = _read_result(request, reward_dir, exit_status, folder, guarded)
        result.cleanup.append(
            f"the test script ran in namespaces of its own ({verify_ns.__name__})"
            + (", its network only loopback" if request.own_network else "")
            if not namespaces
            else f"the test script ran in the sandbox's namespaces: {namespaces}"
        )
        result.leftover = await self._clean_up(baseline, fenced, result.cleanup)
        log.info("verify: exit %d, rewards %s", result.exit_code, dict(result.rewards) or result.reward_error)
        yield pb.VerifyEvent(result=result)

    async def _harden_in_time(
        self, baseline: Baseline, report: pb.HardeningReport, request: pb.VerifyRequest
    ) -> list[str] | None:
        """`_harden` as `request` asks, within `harden_timeout_seconds`: its plugins, or None when
        it failed or ran out of time (the last note of `report` says why)."""
        try:
            keep = request.keep_agent_processes and not request.soft
            return await asyncio.wait_for(
                self._harden(baseline, report, dict(request.env), soft=request.soft, keep=keep),
                self.harden_timeout_seconds,
            )
        except (TimeoutError, asyncio.TimeoutError, QuiesceError, VerifyError) as exc:  # noqa: UP041 - Python 3.10
            failure = str(exc) or f"hardening took longer than {self.harden_timeout_seconds:g} s"
            report.notes.append(f"hardening failed, the test script was not run: {failure}")
            return None

    async def _enter_fence(
        self, baseline: Baseline, request: pb.VerifyRequest, verifier_dir: str, reward_dir: str
    ) -> tuple[fence.Fence | None, str]:
        """For a soft verify, the `_fence` entered (None where there is none); and why it could
        not be set up (the test script is then not run), else empty."""
        if not request.soft:
            return None, ""
        try:
            fenced = self._fence(baseline, request, verifier_dir, reward_dir)
            if fenced is not None:
                await fenced.enter()
        except (SnapshotError, ToolError, VerifyError, OSError) as exc:
            return None, f"the soft verify fence could not be set up ({exc}); the test script was not run"
        return fenced, ""

    def _fence(
        self, baseline: Baseline, request: pb.VerifyRequest, verifier_dir: str, reward_dir: str
    ) -> fence.Fence | None:
        """The fence around a soft verify in a sandbox of its own (an agent user is set); None
        elsewhere (the agent runs as the sidecar's user on the host: nothing to fence it from)."""
        if not baseline.agent_user:
            return None
        areas = [*baseline.roots[:2], *SCRATCH_DIRS]  # the workspace, the agent's HOME
        logs = os.path.dirname(os.path.normpath(reward_dir))
        if logs != "/":
            areas.append(logs)
        rest: list[str] | None = None
        if fence.host_overlay_root():  # / is the host's: only the sandbox's own mounts are walked
            rest = [mount for mount in fence.writable_mounts() if mount != "/"]
        else:
            areas.append(pwd.getpwuid(os.geteuid()).pw_dir)  # the verifier's HOME (root's)
        return fence.Fence(
            self.snapshots,
            areas,
            discard=[verifier_dir],
            rest=rest,
            agent_uid=_agent_uid(baseline),
            keep_reaped=self.groups.waited,
            spare=self.groups.services(),
        )

    async def _clean_up(
        self, baseline: Baseline, fenced: fence.Fence | None, notes: MutableSequence[str]
    ) -> str:
        """After the script: kill every process it left (all of a soft verify, `fence.Fence.leave`),
        appending what was done to `notes`; returns what could not be undone, or empty."""
        try:
            if fenced is None:
                selection = quiesce.Selection(
                    uid=_agent_uid(baseline), descendants=True, spare=self.groups.services()
                )
                await asyncio.to_thread(quiesce.quiesce, selection, keep_reaped=self.groups.waited)
                self.groups.kill(services=False)
                return ""
            left = await fenced.leave()
            self.groups.kill(services=False)
        except (QuiesceError, SnapshotError, ToolError, VerifyError, OSError) as exc:
            return f"cleaning up after the verify failed: {exc}"
        for note in left.notes():
            log.info("%s", note)
            notes.append(note)
        return left.error()

    def _private_folder(self) -> str:
        """The sidecar's state folder (its snapshots' parent; made root-only if missing), where a
        verify's report and guard folders live: outside ``/tmp``, which the script sees overlaid."""
        parent = os.path.dirname(self.snapshots.root)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        return parent

    async def _run_script(
        self,
        script: str,
        cwd: str,
        env: dict[str, str],
        timeout_seconds: float,
        launch: Callable[[list[str]], list[str]] | None = None,
    ) -> AsyncGenerator[pb.VerifyEvent | pb.ExecExit, None]:
        """Run the test script as the sidecar's user in `cwd` (through `launch`, e.g. in namespaces
        of its own, `verify_ns.command`; None: as it is); yields its output events, then its exit."""
        argv = ["sh", "-c", 'exec "$0"', script]  # sh runs a script without #! line itself
        command = processes.Command(
            argv=launch(argv) if launch is not None else argv,
            cwd=cwd,
            env=env,
            user=processes.user_name(os.geteuid()),
            switch_to=None,
            timeout_seconds=timeout_seconds,
            stdin=b"",
        )
        async with contextlib.aclosing(processes.run(command, self.groups)) as events:
            async for event in events:
                if event.HasField("exit"):
                    yield event.exit
                elif event.HasField("stdout"):
                    yield pb.VerifyEvent(stdout=event.stdout)
                else:
                    yield pb.VerifyEvent(stderr=event.stderr)

    async def _harden(
        self,
        baseline: Baseline,
        report: pb.HardeningReport,
        env: dict[str, str],
        *,
        soft: bool = False,
        keep: bool = False,
    ) -> list[str]:
        """Steps 1 to 3 of the module docstring, filling `report`; then, with plugin autoloading
        off, scans the sandbox's ``python3`` (found in `env`'s PATH) again. `soft` (a soft verify
        between the rounds of a trial) skips steps 2 and 3: the agent goes on in the workspace
        afterwards, so its build config and start-up hooks stay as it left them. `keep`
        (``VerifyRequest.keep_agent_processes``): step 1 freezes the agent's processes instead
        of killing them, and they go on after step 3 (`quiesce.let_go`).

        Returns:
            The pytest plugins the test script's pytest loads (`pytest_plugins.allowed`).

        Raises:
            QuiesceError: the agent's processes outlived the quiesce's time limit.
            VerifyError: ``failed`` when the agent user is unknown or the restore failed.
        """
        selection = quiesce.Selection(
            uid=_agent_uid(baseline), descendants=True, spare=self.groups.services()
        )
        frozen = None
        if keep:
            frozen = await asyncio.to_thread(quiesce.freeze, selection, keep_reaped=self.groups.waited)
        else:
            killed = await asyncio.to_thread(quiesce.quiesce, selection, keep_reaped=self.groups.waited)
            report.killed_groups = killed + self.groups.kill(services=False)
        notes: list[str] = []
        if soft:
            notes.append("soft verify: build config and start-up hooks left as the agent left them")
        if baseline.snapshot_paths and not soft:
            try:
                report.restored.extend(await self.snapshots.restore(BASELINE_SNAPSHOT, notes))
            except SnapshotError as exc:
                raise VerifyError("failed", f"restoring the verification baseline: {exc}") from exc
            if os.geteuid() == 0:  # the agent's user can no longer rewrite what was put back
                folders = [*baseline.roots, *baseline.site_dirs]
                for path in baseline.snapshot_paths:
                    nofollow.chown_root(path, trusted_folder(path, folders))
        if baseline.hardening.delete_injected_hooks and not soft:
            known = set(baseline.hooks)
            found = await asyncio.to_thread(find_hooks, baseline.roots, baseline.site_dirs)
            folders = [*baseline.roots, *baseline.site_dirs]
            for path in (path for path in found if path not in known):
                nofollow.unlink(path, trusted_folder(path, folders))
                report.deleted.append(path)
        declared = list(baseline.hardening.pytest_plugins)
        plugins = declared
        if not baseline.hardening.plugin_autoload:
            now = await pytest_plugins.scan_or_error({"PATH": DEFAULT_PATH, **env})
            decision = pytest_plugins.allowed(declared, baseline.plugins, now)
            plugins = decision.names
            notes.extend(decision.notes)
        if frozen is not None:
            notes.append(await asyncio.to_thread(quiesce.let_go, frozen, baseline.roots[:1]))
        report.notes.extend(notes)
        log.info("hardening: killed %d, deleted %s, notes %s", report.killed_groups, report.deleted, notes)
        return plugins

    @staticmethod
    def _script_env(
        baseline: Baseline,
        request: pb.VerifyRequest,
        report: pytest_report.ReportFolder | None,
        plugins: list[str],
        cwd: str,
    ) -> dict[str, str]:
        """The test script's environment: the image's, then the request's, cleaned and locked down
        as the baseline's hardening options say; pytest reads only the configuration shipped with
        the tests (`shipped_pytest_config`, else none) with `cwd` as its rootdir, loads `plugins`
        (``-p NAME``) and writes its report into `report` when given."""
        env = dict(request.image_env)  # the task author's, fixed before the agent ran: kept whole
        env |= {key: value for key, value in request.env.items() if key not in UNSAFE_VARIABLES}
        env.setdefault("PATH", DEFAULT_PATH)
        if baseline.agent_user:  # not the agent's HOME, whose dotfiles and user site it controls
            env["HOME"] = pwd.getpwuid(os.geteuid()).pw_dir
        env |= {
            "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "REROLL_VERIFIER_DIR": request.verifier_dir,
        }
        options = baseline.hardening
        env.pop("PYTEST_ADDOPTS", None)
        flags = pytest_plugins.addopts(plugins)
        if options.pytest_addopts:
            config = shipped_pytest_config(request.verifier_dir)
            rootdir = f" --rootdir={shlex.quote(cwd)}" if config is None else ""  # else the file's folder
            env["PYTEST_ADDOPTS"] = (
                f"-c {shlex.quote(config or os.devnull)}{rootdir} --confcutdir={request.verifier_dir}"
                f" -p no:cacheprovider{flags}"
            )
            if report is not None:
                env["PYTEST_ADDOPTS"] += report.addopts()
        elif flags:
            env["PYTEST_ADDOPTS"] = flags.lstrip()
        if not options.plugin_autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        return env
