"""Fixtures shared by every test folder, and the fast tier.

The fast tier (``pytest --fast``, ``make test-fast``) runs every test that stays in this process:
it leaves out tests marked ``slow`` or ``spawns``. A test gets ``spawns`` from a mark on the test,
from ``pytestmark = pytest.mark.spawns`` on its module (which ``--fast`` then does not even
import), or from any fixture it uses, directly or not, that is decorated with `spawning`. In a
``--fast`` run an audit hook refuses every process start (subprocess, fork, exec, spawn) and
every connection beyond loopback, and fails the test that tried, naming the mark to add: a new
test is fast unless it says otherwise, and cannot forget to say so.
"""

from __future__ import annotations

import functools
import hashlib
import io
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import pytest
from reroll.host import pythons
from reroll.sandbox.docker.disk import LOCAL_PREFIX, SizedDisk
from reroll.sandbox.docker.disk import remove as remove_disk
from reroll.sandbox.docker.images import ensure_catalogue
from reroll.sandbox.local import cow
from reroll.sandbox.local.storage import remove_pools_under
from xdist.scheduler import LoadFileScheduling

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "tasks"

SPAWNING_FIXTURES: set[str] = set()
"""Names of the fixtures decorated with `spawning`."""
SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.system"}
)
"""Audit events (see the ``sys.addaudithook`` table) that start a process."""
FixtureFunction = TypeVar("FixtureFunction", bound=Callable[..., Any])


def spawning(fixture: FixtureFunction) -> FixtureFunction:
    """Declare that a fixture starts processes, containers or mounts: every test that uses it is
    marked ``spawns`` and left out of the fast tier. Put it below ``@pytest.fixture``.

    Args:
        fixture: The fixture function; its name is the fixture's name.

    Returns:
        The same function.
    """
    SPAWNING_FIXTURES.add(fixture.__name__)
    return fixture


class _FastGuard:
    """What the audit hook refuses while a fast-tier test runs, and what it refused."""

    def __init__(self) -> None:
        self.test: str | None = None
        """Node id of the fast-tier test running now; None: refuse nothing."""
        self.refused: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if self.test is None:
            return
        if event in SPAWN_EVENTS:
            what = f"started a process ({event} {args[1] if event == 'subprocess.Popen' else args[0]!r})"
        elif event == "socket.connect" and not _is_local(args[1]):
            what = f"connected to {args[1]!r}, beyond loopback"
        else:
            return
        self.refused.append(
            f"{self.test} {what} in the fast tier: mark the test (or its module's pytestmark) "
            "@pytest.mark.spawns, or decorate the fixture that does it with tests.conftest.spawning"
        )
        raise PermissionError(self.refused[-1])

    def around(self, item: pytest.Item) -> Generator[None, object, object]:
        """A hook wrapper's body: guard one phase of `item` (unless it is marked ``spawns``)."""
        if not item.config.getoption("fast") or item.get_closest_marker("spawns"):
            return (yield)
        self.test, self.refused = item.nodeid, []
        try:
            result = yield
        finally:
            self.test = None
        if self.refused:  # refused, yet the test swallowed the error
            raise pytest.fail.Exception(self.refused[0])
        return result


def _is_local(address: object) -> bool:
    """Whether a ``socket.connect`` address is a Unix socket or on loopback."""
    if not isinstance(address, tuple):
        return True  # AF_UNIX path (or abstract name)
    host = str(address[0])
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


_GUARD = _FastGuard()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: leave out tests marked slow or spawns; fail any test that starts a process",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spawns: starts processes, containers or mounts (left out by --fast)")
    if config.getoption("fast"):
        sys.addaudithook(_GUARD)  # cannot be removed: it does nothing while no fast test runs


MODULE_MARK = re.compile(r"^pytestmark = .*\bpytest\.mark\.(spawns|slow)\b", re.MULTILINE)
"""A module-level ``spawns`` or ``slow`` mark, read from the source: ``--fast`` skips the import."""


collect_ignore = ["fixtures/skillsbench", "fixtures/terminal-bench-2"]
"""Third-party tasks kept unmodified: their ``tests/test_outputs.py`` run only inside their sandbox."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``--fast``, skip test modules marked ``spawns`` or ``slow`` as a whole, unimported
    (the imports of the modules left out would be half the fast tier's time)."""
    if (
        config.getoption("fast")
        and collection_path.name.startswith("test_")
        and collection_path.suffix == ".py"
    ):
        return MODULE_MARK.search(collection_path.read_text()) is not None or None
    return None


SLOWEST_UNITS = (
    "e2e/test_corpus_slice.py[skillsbench/sales-pivot-analysis-docker]",
    "agents/test_openhands.py[local]",  # next, two units that start without Docker: see below
    "sandbox/test_contract.py",
    "agents/test_openhands.py[docker]",
    "e2e/test_corpus_slice.py[terminal-bench-2/largest-eigenval-docker]",
    "e2e/test_example_tasks.py",
    "e2e/test_main_job.py[docker]",
    "e2e/test_trials.py",
    "jobs/test_ray_cluster.py",
    "e2e/test_main_job.py[local]",
    "agents/test_aider.py[docker]",
    "e2e/test_agent_judged_example.py",
    "agents/test_claude_code.py",
    "e2e/test_checkpoint_jobs.py",
    "e2e/test_skillsbench_tasks.py",
    "e2e/test_clone_in_tmp.py",
    "e2e/test_crash_rollouts.py",
    "jobs/test_ray_executor.py",
)
"""The units of `make test`'s scheduling (`scheduling_unit`: a module under ``tests/``, or a part
of one of `SPLIT_MODULES`; a module named here stands for all its parts) that took longest, summed
over their tests (447 s to 107 s in a run from scratch on 3 workers, 2026-11-30), slowest first.
`make test` starts them first (`slowest_first`, with pytest-xdist's ``--no-loadscope-reorder``):
xdist's own order, by number of tests per unit, put these few-test units in the back half of its
queue, where one of them could keep a worker busy for minutes after the others ran out of work.
The first unit builds reroll's images (`docker_images`, ~100 s from scratch) while the next two
run local sandboxes first: three docker units at the start had three workers waiting on that build."""
SPLIT_MODULES = (
    "e2e/test_corpus_slice.py",
    "agents/test_openhands.py",
    "e2e/test_main_job.py",
    "agents/test_aider.py",
)
"""Test modules (under ``tests/``) that `make test` runs in parts, each part on whichever worker is
free (`scheduling_unit`): the tests of one parameter id (an end-to-end's sandbox backend; a corpus
task on a backend) make a part. Only modules whose module fixtures each depend on that parameter
(`sandbox_backend`), or that have none, belong here: a module fixture is built once per part that
uses it. What the parts share across the machine (an image, an agent's install in the cache or
volume, a catalogue image) is built under a host-wide lock, once, whichever part comes first."""
PARAMETER_ID = re.compile(r"\[([^\[\]]*)\]$")
"""The parameter id that ends a test's node id (``test_x[docker]``)."""


def scheduling_unit(nodeid: str) -> str:
    """The unit of `make test`'s scheduling that the test of `nodeid` belongs to: a unit runs on one
    pytest-xdist worker, its tests in collection order (`PartScheduling`).

    Args:
        nodeid: The test's node id, ``tests/<module>::<name>`` (``<name>[<id>]`` with parameters).

    Returns:
        Its module's path under ``tests/`` (``agents/test_codex.py``); for a module of
        `SPLIT_MODULES`, that path and the test's parameter id, ``agents/test_aider.py[docker]``
        (``[]``: a test without parameters).
    """
    path, _, name = nodeid.partition("::")
    module = path.removeprefix("tests/")
    if module not in SPLIT_MODULES:
        return module
    found = PARAMETER_ID.search(name)
    return f"{module}[{found.group(1) if found else ''}]"


def slowest_first(items: list[pytest.Item]) -> None:
    """Sort `items` in place: the units of `SLOWEST_UNITS` first, in its order, then the rest in
    collection order; the order within a unit is kept."""
    rank = {name: index for index, name in enumerate(SLOWEST_UNITS)}

    def unit_rank(item: pytest.Item) -> int:
        unit = scheduling_unit(item.nodeid)
        return rank.get(unit, rank.get(unit.partition("[")[0], len(rank)))

    items.sort(key=unit_rank)


class PartScheduling(LoadFileScheduling):  # type: ignore[misc]  # xdist has no type hints
    """pytest-xdist's ``--dist loadfile`` by `scheduling_unit`: a module on one worker, save the
    modules of `SPLIT_MODULES`, whose parts each go to whichever worker is free."""

    def _split_scope(self, nodeid: str) -> str:
        return scheduling_unit(nodeid)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> PartScheduling | None:
    """`make test`'s ``--dist loadfile`` schedules by `scheduling_unit` (`PartScheduling`)."""
    return PartScheduling(config, log) if config.getoption("dist") == "loadfile" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slowest_first(items)
    for item in items:
        if SPAWNING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spawns)
    if not config.getoption("fast"):
        return
    left_out = {i for i in items if i.get_closest_marker("spawns") or i.get_closest_marker("slow")}
    if left_out:
        config.hook.pytest_deselected(items=list(left_out))
        items[:] = [i for i in items if i not in left_out]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _GUARD.around(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _GUARD.around(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _GUARD.around(item))


@pytest.fixture(scope="session", autouse=True)
def _pools_removed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """At the session's end, remove the copy-on-write pools its recordings kept (a recording on
    local keeps a checkpoint at every step by default) so no loop mount outlives the session."""
    yield
    remove_pools_under(tmp_path_factory.getbasetemp())


@pytest.fixture
def examples() -> Path:
    """The bundled example tasks."""
    return EXAMPLES


@pytest.fixture(scope="session")
@spawning
def docker_images() -> str:
    """Build reroll's base and sandbox images with scripts/build-images unless they exist (~90 s
    on a clean machine, under a second when up to date); returns the script's output."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build-images")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"scripts/build-images failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module", params=["local", "docker"])
@spawning
def sandbox_backend(request: pytest.FixtureRequest) -> str:
    """A sandbox backend for a whole module's end-to-end runs: each module runs once per backend;
    docker gets its images built first."""
    if request.param == "docker":
        request.getfixturevalue("docker_images")
    return str(request.param)


def labelled_containers(run_id: str) -> list[str]:
    """Names of the containers, running or not, labelled ``reroll.run_id=<run_id>``."""
    done = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=reroll.run_id={run_id}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


@functools.cache
def _install_mkfs_tools() -> None:
    """apt-get install btrfs-progs xfsprogs (Debian mirror); failures leave the tools missing."""
    if shutil.which("apt-get") is None:
        return
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "btrfs-progs", "xfsprogs"],
    ):
        subprocess.run(
            argv, capture_output=True, timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        )


NEEDS_BTRFS = [
    pytest.mark.spawns,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts need root"),
    pytest.mark.skipif(not cow.available(), reason="btrfs-progs (mkfs.btrfs) is not installed"),
]
"""The marks of a test module on a real loop-mounted btrfs (`btrfs_disk`)."""


@pytest.fixture
def btrfs_disk() -> Iterator[SizedDisk]:
    """A 64 MiB btrfs, loop-mounted like a local sandbox's disk, removed after the test (`NEEDS_BTRFS`)."""
    made = SizedDisk.create("test-btrfs", 64 << 20, {}, "test", prefix=LOCAL_PREFIX, filesystem="btrfs")
    try:
        yield made
    finally:
        remove_disk(made.folder)


@pytest.fixture(params=["btrfs", "xfs"])
@spawning
def reflink_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A folder on a fresh loop-mounted btrfs or XFS (reflink=1) file system: one that clones files.

    Installs btrfs-progs and xfsprogs with apt-get when missing (once per session); skips, saying
    why, unless this runs as root with the mkfs tool and a free loop device.
    """
    kind = str(request.param)
    mkfs = {"btrfs": ["mkfs.btrfs", "-q", "-f"], "xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"]}[kind]
    if os.geteuid() != 0:
        pytest.skip(f"a loop-mounted {kind} needs root")
    if shutil.which(mkfs[0]) is None:
        _install_mkfs_tools()
    if shutil.which(mkfs[0]) is None:
        pytest.skip(f"{mkfs[0]} is not installed ({kind} tools) and apt-get could not install it")
    image = tmp_path / f"{kind}.img"
    with open(image, "wb") as out:
        out.truncate(320 * 1024 * 1024)  # XFS wants at least 300 MB
    # A short path: a local sandbox's Unix socket below it must stay within 107 bytes.
    mount_point = Path(tempfile.mkdtemp(prefix=f"rr-{kind}-"))
    made = subprocess.run([*mkfs, str(image)], capture_output=True, text=True, timeout=60)
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mount_point)], capture_output=True, text=True, timeout=60
    )
    if made.returncode != 0 or mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot make and loop-mount a {kind} image here: {made.stderr}{mounted.stderr}".strip())
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True, timeout=60)
        mount_point.rmdir()


UV = str(Path(sys.executable).parent / "uv")


@pytest.fixture(scope="session")
@spawning
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `uv build` makes from the checkout (through the sdist), once per session."""
    dist = tmp_path_factory.mktemp("dist")
    argv = [UV, "build", "--quiet", "--out-dir", str(dist), str(ROOT)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=dist, timeout=900)
    assert done.returncode == 0, f"uv build exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    (built,) = dist.glob("reroll-*.whl")
    return built


TEST_IMAGE_LABEL = "reroll.test-image"
"""Label of the images these fixtures build (``docker image prune --filter label=…`` removes them)."""

_NO_PYTHON_DOCKERFILE = """FROM reroll/base:bookworm
RUN apt-get purge -y -qq --auto-remove python3 python3-minimal python3.11 python3.11-minimal \\
      libpython3.11-minimal libpython3.11-stdlib >/dev/null \\
 && ! command -v python3
"""
_BUSYBOX_DOCKERFILE = """FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
"""


def build_test_image(
    client: docker.DockerClient,
    repository: str,
    dockerfile: str,
    files: dict[str, bytes],
    *,
    network: str = "none",
) -> str:
    """Build `dockerfile` with `files` as its context, as ``repository:<hash of both>`` unless it
    exists; its RUN steps have the docker network `network` (``none``: no network)."""
    digest = hashlib.sha256(dockerfile.encode())
    for name, content in sorted(files.items()):
        digest.update(name.encode() + hashlib.sha256(content).digest())
    tag = f"{repository}:{digest.hexdigest()[:12]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        for name, content in {"Dockerfile": dockerfile.encode(), **files}.items():
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(content), 0o755
            archive.addfile(member, io.BytesIO(content))
    context.seek(0)
    client.images.build(
        fileobj=context,
        custom_context=True,
        tag=tag,
        rm=True,
        network_mode=network,
        labels={TEST_IMAGE_LABEL: "1"},
    )
    return tag


def _static_busybox() -> bytes:
    """Debian's static busybox binary (package busybox-static, from the Debian mirror with apt-get)."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            ["apt-get", "download", "-qq", "busybox-static"],
            cwd=scratch,
            check=True,
            capture_output=True,
            timeout=300,
        )
        (package,) = Path(scratch).glob("busybox-static_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(package), f"{scratch}/root"], check=True, timeout=60)
        return Path(scratch, "root", "bin", "busybox").read_bytes()


@pytest.fixture(scope="session")
@spawning
def variant_images(docker_images: str) -> dict[str, str]:
    """``{"no-python": tag, "busybox": tag, "trixie": tag}``: images built once (cached by tag) from
    reroll's base image minus Python, from scratch with Debian's static busybox alone, and the
    catalogue's Debian trixie (no Python; debootstrapped on first use)."""
    client = docker.from_env()
    try:
        return {
            "trixie": ensure_catalogue(client, "trixie"),
            "no-python": build_test_image(client, "reroll-test/no-python", _NO_PYTHON_DOCKERFILE, {}),
            "busybox": build_test_image(
                client, "reroll-test/busybox", _BUSYBOX_DOCKERFILE, {"busybox": _static_busybox()}
            ),
        }
    finally:
        client.close()


@pytest.fixture
def host_pythons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``host_pythons("3.12.1", …)``: from then on the host's CPythons (`reroll.host.pythons.host_python`)
    are exactly these pyenv versions: empty files in a pyenv folder of the test's, and no
    ``python3.X`` on PATH."""

    def have(*versions: str) -> None:
        root = Path(tempfile.mkdtemp(prefix="pyenv-", dir=tmp_path))
        for version in versions:
            program = root / version / "bin" / f"python{version.rsplit('.', 1)[0]}"
            program.parent.mkdir(parents=True)
            program.write_text("")
        monkeypatch.setattr(pythons, "PYENV_VERSIONS", str(root))
        monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))

    return have
