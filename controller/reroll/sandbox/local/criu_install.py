"""CRIU (Checkpoint/Restore In Userspace) in a folder of its own: the process-level checkpoint of
an agent that has no resumable session (`reroll.sandbox.local.criu`).

Debian bookworm's ``criu`` (3.17) fails ``criu check`` on the kernels reroll runs on. Trixie's
4.1.1 passes it but cannot dump a process holding a TCP socket on Linux 6.16 or later (the
agent's connection to its LLM proxy): it reads ``SO_PASSCRED`` and ``SO_PASSSEC`` of every
socket, which those kernels refuse on TCP sockets (``sockets: Can't get 1:16 opt: Operation not
supported``; CRIU's issues 2705 and 2718, fixed in 4.2). So CRIU comes from Debian unstable
(`SUITE`; 4.2.1 when written), at least `MIN_VERSION`. Installing such a package on a bookworm
host (``apt-get install -t trixie criu``) would replace the C library, switch ``python3`` to
3.13 and remove ``python3.11-venv`` and ``libssl3``, so it is never installed: `ensure_criu`
downloads the ``.deb`` of ``criu`` and of every library it needs, recursively — that release's
C library and ELF loader included — with ``apt-get download`` from a private apt state (its own
sources list naming `SUITE`, its own lists
and cache; the host's apt configuration and dpkg database are not touched), unpacks them with
``dpkg-deb -x`` into ``<cache>/criu/<key>/root/`` and runs CRIU through that folder's own loader
with that folder's libraries (`CriuInstall.argv`). The first use on a machine installs it (about
8 MB downloaded, 5 to 12 s), under a cache lock so that concurrent processes install it once
(`reroll.sandbox.sidecar_bundle.build_once`); the folder is 16 MB.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from reroll_contracts.errors import ImageBuildError

from reroll.cache import cache_dir
from reroll.sandbox.sidecar_bundle import build_once, run_build_step

SUITE = "sid"
"""The Debian release CRIU's packages come from (see the module docstring for why not trixie)."""
MIN_VERSION = (4, 2)
"""The oldest CRIU that dumps TCP sockets on Linux 6.16 and later."""
MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
"""Debian's archive keys (bookworm's ``debian-archive-keyring`` holds trixie's)."""
PACKAGE = "criu"
INSTALL_FORMAT = 1
"""Part of the install's key: a change of what `ensure_criu` lays out installs it again."""
LIB_DIR = "usr/lib/x86_64-linux-gnu"
LOADER = f"{LIB_DIR}/ld-linux-x86-64.so.2"
PROGRAM = "usr/sbin/criu"
DROPPED = ("usr/share", "usr/lib/x86_64-linux-gnu/gconv", "usr/bin", "sbin", "etc", "var")
"""What the unpacked packages hold that CRIU never reads (documentation, locales' converters,
the C library's programs and configuration)."""
PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


@dataclass(frozen=True)
class CriuInstall:
    """An unpacked CRIU: `root` holds ``usr/sbin/criu``, its libraries and its loader."""

    root: Path

    def argv(self, *args: str, root: Path | None = None) -> list[str]:
        """The command that runs ``criu ARGS`` with this install's loader and libraries.

        Args:
            args: CRIU's arguments.
            root: where the install's folder is seen by the process that runs the command
                (default: `root`; e.g. ``/proc/self/fd/N`` after a change of mount namespace).
        """
        seen = root or self.root
        return [str(seen / LOADER), "--library-path", str(seen / LIB_DIR), str(seen / PROGRAM), *args]


def _apt_options(state: Path) -> list[str]:
    """apt options that keep every file apt reads or writes under `state`: a sources list naming
    only `SUITE`, no dpkg status (every dependency is downloaded, none taken from the host)."""
    return [
        f"-oDir::Etc::sourcelist={state / 'sources.list'}",
        "-oDir::Etc::sourceparts=-",
        f"-oDir::State::Lists={state / 'lists'}",
        f"-oDir::Cache={state / 'cache'}",
        "-oDir::State::status=/dev/null",
        "-oAPT::Sandbox::User=root",
        "-oDebug::NoLocking=1",
    ]


def dependency_closure(depends_output: str) -> list[str]:
    """The package names in ``apt-cache depends --recurse``'s output (its unindented lines;
    virtual packages, shown as ``<name>``, left out), sorted.

    Raises:
        ImageBuildError: a line is not a package name (apt's output changed).
    """
    names = set()
    for line in depends_output.splitlines():
        if not line or line[0].isspace() or line.startswith("<"):
            continue
        if not PACKAGE_NAME.match(line):
            raise ImageBuildError(f"apt-cache depends printed an unexpected line: {line!r}")
        names.add(line)
    return sorted(names)


def parse_version(said: str) -> tuple[int, ...] | None:
    """The version ``criu --version`` printed (``Version: 4.2.1`` → ``(4, 2, 1)``), None without one."""
    found = re.search(r"^Version:\s*(\d+(?:\.\d+)*)", said, re.MULTILINE)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def _build(scratch: Path, target: Path) -> None:
    """Download `PACKAGE` and its dependencies from `SUITE` into `scratch` and unpack them into `target`.

    Raises:
        ImageBuildError: apt or dpkg-deb is missing or failed, or the result does not run.
    """
    for program in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(program) is None:
            raise ImageBuildError(f"installing CRIU needs {program} (a Debian host)")
    state, debs = scratch / "apt", scratch / "debs"
    for folder in (state / "lists" / "partial", state / "cache" / "archives" / "partial", debs):
        folder.mkdir(parents=True)
    (state / "sources.list").write_text(f"deb [signed-by={KEYRING}] {MIRROR} {SUITE} main\n")
    options = _apt_options(state)
    run_build_step(["apt-get", *options, "update"], f"apt-get update ({SUITE}, for CRIU)")
    closure = dependency_closure(
        run_build_step(
            [
                "apt-cache",
                *options,
                "depends",
                "--recurse",
                "--no-recommends",
                "--no-suggests",
                "--no-conflicts",
                "--no-breaks",
                "--no-replaces",
                "--no-enhances",
                PACKAGE,
            ],
            f"apt-cache depends {PACKAGE}",
        )
    )
    run_build_step(
        [
            "sh",
            "-c",
            'cd "$1" && shift && exec "$@"',
            "sh",
            str(debs),
            "apt-get",
            *options,
            "download",
            *closure,
        ],
        f"apt-get download {PACKAGE} and its libraries",
    )
    target.mkdir()
    for deb in sorted(debs.glob("*.deb")):
        run_build_step(["dpkg-deb", "-x", str(deb), str(target)], f"dpkg-deb -x {deb.name}")
    for dropped in DROPPED:
        shutil.rmtree(target / dropped, ignore_errors=True)
    said = run_build_step(CriuInstall(target).argv("--version"), "criu --version")
    if (version := parse_version(said)) is None or version < MIN_VERSION:
        raise ImageBuildError(
            f"{SUITE}'s criu is not at least {'.'.join(map(str, MIN_VERSION))}: it says {said.strip()!r}"
        )


def ensure_criu() -> CriuInstall:
    """CRIU in ``<cache>/criu/<key>/root``, installed on first use (see the module docstring).

    Raises:
        ImageBuildError: it cannot be installed here (no apt, no network, a failed download).
    """
    key = f"{SUITE}-{INSTALL_FORMAT}"
    return CriuInstall(build_once(cache_dir() / "criu" / key / "root", "criu", _build))
