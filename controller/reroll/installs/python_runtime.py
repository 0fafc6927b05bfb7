"""The CPython every pip-installed agent is installed with (``python:`` in agents.yaml): carried
in the shared installs, so that no install depends on the task image's Python, its
``python3-venv`` or its version (OpenHands needs 3.12 exactly, Debian bookworm has 3.11), and an
install made in one image runs in every other (docker's agents volume is shared by all).

Nothing reroll may fetch ships an interpreter: PyPI has none (its ``portable-python`` builds
from python.org's sources, which are out of reach), Debian bookworm has 3.11 and trixie 3.13.
The host's own build is used instead (pyenv's, as on reroll's machines, or ``pythonX.Y`` on
PATH), made relocatable the way the sidecar bundle is (`reroll.sandbox.sidecar_bundle`): the
interpreter, its shared libpython and its extension modules get the host's C library, its ELF
loader and the other libraries they link (OpenSSL, libffi, SQLite, …) bundled beside them, the
loader as the interpreter's ELF interpreter and that folder as the RPATH of each (patchelf), so
nothing is taken from the sandbox's image. ``libstdc++`` and ``libgcc_s`` are bundled and
preloaded too: the wheels of an agent (pydantic-core, tokenizers, …) link them and expect them
from the system. The loader's path is absolute, so a runtime is built for the one path
`prefix` it is used at (the sandbox's agents folder); the standard library's tests, IDLE,
tkinter and the base site-packages are left out (a venv brings its own pip); its byte code is
compiled in advance (the agent's user cannot write it at run time).

`provide_python` chooses per sandbox: the relocatable runtime, uploaded once into the agents
folder (a docker volume shared by every container, whatever its image; the local sandboxes'
store), else the sandbox's own ``pythonX.Y`` if it can make a venv. Built in about 20 s
into ``<cache>/python/<key>/``; ~110 MB.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import shutil
import subprocess
from pathlib import Path

from reroll_contracts.errors import AgentInstallError, ImageBuildError

from reroll.cache import cache_dir
from reroll.host.pythons import PYENV_VERSIONS as PYENV_VERSIONS  # re-exported
from reroll.host.pythons import host_python as host_python  # re-exported
from reroll.sandbox.base import Sandbox
from reroll.sandbox.sidecar_bundle import (
    Log,
    build_once,
    copy_libraries,
    elf_files,
    folder_size_bytes,
    patchelf_program,
    run_build_step,
    set_modes,
)

LIBS = "lib/reroll-libs"
"""The runtime's folder of bundled shared libraries, relative to its prefix."""
PRELOADED = ("libstdc++.so.6", "libgcc_s.so.1")
"""Libraries bundled and made needed by the interpreter, so that extension modules find them
already loaded whatever RUNPATH they carry."""
LEFT_OUT = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3", "site-packages", "__pycache__", "config-*")
"""Folder names of the standard library the runtime does without (``config-*``: the static
library and Makefile for building against it)."""
_RECIPE = "pyenv copy; rpath + interpreter patched; glibc, loader, libstdc++, libgcc_s bundled; pyc; v2"
"""Changing how a runtime is made must change its key: bump this text with the recipe."""

logger = logging.getLogger(__name__)


def runtime_key(python: Path, prefix: str) -> str:
    """16 hex digits naming the runtime of interpreter `python` built for `prefix`: the
    interpreter's version string, the prefix and the recipe."""
    done = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version)"], capture_output=True, text=True, timeout=60
    )
    return hashlib.sha256(f"{done.stdout}\0{prefix}\0{_RECIPE}".encode()).hexdigest()[:16]


def ensure_runtime(python: Path, prefix: str, log: Log = logger.info) -> Path:
    """The host folder of the relocatable runtime of `python` made to run at `prefix` (an
    absolute path in a sandbox), built when missing.

    Raises:
        ImageBuildError: a build step failed (patchelf, ldd), or `python` is not an
            ``<prefix>/bin/pythonX.Y`` of a CPython built with ``--enable-shared``.
    """
    target = cache_dir() / "python" / runtime_key(python, prefix) / "runtime"
    if not (target.parent / ".complete").exists():
        build_once(target, "python-runtime", lambda scratch, folder: _build(python, prefix, scratch, folder))
        log(f"python runtime for {prefix}: {target} ({folder_size_bytes(target) / 1e6:.0f} MB)")
    return target


def _build(python: Path, prefix: str, scratch: Path, target: Path) -> None:
    """Copy the interpreter's installation into `target` (through `scratch`) and make it run at `prefix`."""
    built = scratch / "runtime"
    home = python.parent.parent
    name = python.name
    version = name.removeprefix("python")
    if not (home / "lib" / f"libpython{version}.so.1.0").is_file():
        raise ImageBuildError(f"{python}: not a CPython built with --enable-shared under {home}")
    (built / "bin").mkdir(parents=True)
    shutil.copy2(python, built / "bin" / name)  # no aliases: upload_dir would copy symlinks as files
    stdlib = f"lib/{name}"
    shutil.copytree(home / stdlib, built / stdlib, symlinks=True, ignore=shutil.ignore_patterns(*LEFT_OUT))
    shutil.copy2(home / "lib" / f"libpython{version}.so.1.0", built / "lib")
    for tk in (built / stdlib / "lib-dynload").glob("_tkinter*"):
        tk.unlink()  # links X11 and Tcl/Tk, which no headless agent needs
    patchelf = patchelf_program()
    elves = elf_files(built)
    for path in elves:  # pyenv's RUNPATH names the host's folder
        run_build_step([patchelf, "--remove-rpath", str(path)], f"patchelf --remove-rpath {path.name}")
    libs = built / LIBS
    libs.mkdir()
    loader = copy_libraries(python, elves, libs, patchelf, extra=PRELOADED)
    rpath = f"{prefix}/{LIBS}:{prefix}/lib"
    for path in elves:
        run_build_step(
            [patchelf, "--force-rpath", "--set-rpath", rpath, str(path)], f"patchelf --set-rpath {path.name}"
        )
    program = built / "bin" / name
    argv = [patchelf, "--set-interpreter", f"{prefix}/{LIBS}/{loader.name}"]
    for soname in PRELOADED:
        argv += ["--add-needed", soname]
    run_build_step([*argv, str(program)], f"patchelf of {name}")
    # Byte code for the agent's user, who cannot write __pycache__ at `prefix`; checked by hash,
    # not by the source's time, which an upload does not keep.
    compile_all = [str(python), "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash"]
    run_build_step([*compile_all, str(built / stdlib)], "compileall of the standard library")
    set_modes(built)
    shutil.move(built, target)


VENV_PROBE = "import ensurepip, venv, sys; print(sys.executable)"
"""Run by a sandbox's own ``pythonX.Y``: it prints its path only when it can make a venv with pip
(Debian splits ``venv``'s ensurepip into ``python3.X-venv``)."""


async def provide_python(sandbox: Sandbox, version: str, env: dict[str, str], log: Log = logger.info) -> str:
    """The path in `sandbox` of a CPython `version` (``3.12``), able to make a venv with pip, that
    an agent's install may use.

    The host's comes first, so that an install in a store shared by every image (docker's
    volume) never depends on the image it was made in: the host's (`host_python`) made
    relocatable (`ensure_runtime`) and uploaded once to ``<agents folder>/python<version>-<key>``
    (a concurrent upload of the same runtime is discarded) — also where the sandbox could run the
    host's at its host path (``local-plain``): ``local`` and ``local-plain`` share one store, and
    the isolated ``local`` sandbox does not see the host's pyenv; else, where the host has none
    or it cannot be made relocatable, the sandbox's own ``pythonX.Y`` on the PATH of `env`, if it
    has ``venv`` and ``ensurepip``.

    Raises:
        AgentInstallError: neither the host nor the sandbox has a usable one (saying why, within
            seconds: nothing is built or downloaded first).
        ImageBuildError: building the relocatable runtime failed and the sandbox has none either.
    """
    host = host_python(version)
    if host is not None:
        try:
            return await _upload_runtime(sandbox, host, version, log)
        except ImageBuildError as exc:
            if own := await _own_python(sandbox, version, env):
                log(f"the host's Python {version} cannot be made relocatable ({exc}): using {own}")
                return own
            raise
    if own := await _own_python(sandbox, version, env):
        return own
    raise AgentInstallError(
        f"the agent needs Python {version} with venv and ensurepip: the host has none to lend it "
        f"(python{version} on PATH or pyenv's under {PYENV_VERSIONS}), and the sandbox's "
        f"python{version} is missing or lacks them (on Debian: apt-get install python{version}-venv)"
    )


async def _own_python(sandbox: Sandbox, version: str, env: dict[str, str]) -> str | None:
    """The sandbox's own ``pythonX.Y`` on the PATH of `env` when it has venv and ensurepip, else None."""
    found = await sandbox.exec(
        ["sh", "-c", f"python{version} -c '{VENV_PROBE}' 2>/dev/null"], env=env, inherit_env=False
    )
    lines = found.stdout.decode(errors="replace").split()
    return lines[-1] if found.exit_code == 0 and lines else None


async def _upload_runtime(sandbox: Sandbox, host: Path, version: str, log: Log) -> str:
    """Upload the relocatable runtime of `host` to the sandbox's agents folder (unless there)
    and return its interpreter's path.

    Raises:
        AgentInstallError: the upload failed.
        ImageBuildError: building the runtime failed.
    """
    prefix = f"{sandbox.layout.agents_dir}/python{version}-{runtime_key(host, sandbox.layout.agents_dir)}"
    program = f"{prefix}/bin/python{version}"
    if (await sandbox.exec(["test", "-x", program], inherit_env=False)).exit_code == 0:
        return program
    runtime = await asyncio.to_thread(ensure_runtime, host, prefix, log)
    partial = f"{prefix}.part-{secrets.token_hex(4)}"
    log(f"uploading the Python {version} runtime to {prefix}")
    await sandbox.upload_dir(runtime, partial)
    moved = await sandbox.exec(
        ["sh", "-c", f'mv -T "{partial}" "{prefix}" 2>/dev/null || rm -rf "{partial}"'], inherit_env=False
    )
    if (await sandbox.exec(["test", "-x", program], inherit_env=False)).exit_code != 0:
        raise AgentInstallError(
            f"uploading the Python {version} runtime to {prefix} failed: {moved.output_text()[-2000:]}"
        )
    return program
