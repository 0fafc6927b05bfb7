"""The relocatable CPython for agents that need a Python the sandbox lacks (OpenHands: 3.12).

The runtime is built for a path under the test's folder and run there on the host with an empty
environment: every shared library it maps comes from its own folder, none from the host's (in
docker the same runtime runs on reroll's bookworm image: tests/agents/test_openhands.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from reroll.host import pythons
from reroll.installs import python_runtime
from reroll.installs.python_runtime import LIBS, ensure_runtime, host_python, provide_python
from reroll.sandbox.layout import SandboxLayout
from reroll.sandbox.results import ExecResult
from reroll_contracts.errors import AgentInstallError

HOST_PYTHON = host_python("3.12")


@pytest.mark.spawns
@pytest.mark.skipif(HOST_PYTHON is None, reason="no Python 3.12 on this host (pyenv's or on PATH)")
def test_the_runtime_runs_at_its_prefix_on_its_own_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert HOST_PYTHON is not None
    monkeypatch.setenv("REROLL_CACHE_DIR", str(tmp_path / "cache"))
    prefix = tmp_path / "opt" / "python3.12"
    shutil.copytree(ensure_runtime(HOST_PYTHON, str(prefix)), prefix, symlinks=True)
    assert not (prefix / "lib" / "python3.12" / "test").exists()
    # byte code compiled in advance, valid whatever the files' times after an upload
    assert (prefix / "lib" / "python3.12" / "__pycache__" / "os.cpython-312.pyc").read_bytes()[
        4:8
    ] == b"\x01\0\0\0"
    probe = (
        "import ssl, sqlite3, ctypes, lzma, bz2, zlib, sys\n"
        "print(sys.prefix)\n"
        "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})))"
    )
    done = subprocess.run(
        [str(prefix / "bin" / "python3.12"), "-c", probe], env={}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    first, *libraries = done.stdout.splitlines()
    assert first == str(prefix)
    assert {
        f"{prefix}/{LIBS}/libc.so.6",
        f"{prefix}/{LIBS}/libssl.so.3",
        f"{prefix}/{LIBS}/libstdc++.so.6",
    } <= set(libraries)
    assert all(library.startswith(f"{prefix}/") for library in libraries), libraries
    venv = tmp_path / "venv"
    made = subprocess.run(
        [str(prefix / "bin" / "python3.12"), "-m", "venv", "--without-pip", str(venv)],
        env={"PATH": os.defpath},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    base = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sys; print(sys.base_prefix)"],
        env={},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert base.stdout.strip() == str(prefix), base.stderr


class ProbedSandbox:
    """A sandbox whose every command prints `stdout` and exits with `exit_code`."""

    def __init__(self, exit_code: int, stdout: bytes) -> None:
        self.layout = SandboxLayout(
            root="/", workspace="/app", logs_dir="/logs", home="/h", agents_dir="/opt/a"
        )
        self.result = ExecResult(
            exit_code=exit_code, stdout=stdout, stderr=b"", timed_out=False, duration_seconds=0.0
        )

    async def exec(self, argv: list[str], **_: object) -> ExecResult:
        return self.result


class HostSandbox:
    """A sandbox that runs each command as a real subprocess on the host, with the `env` given."""

    layout = SandboxLayout(root="/", workspace="/app", logs_dir="/logs", home="/h", agents_dir="/opt/a")

    async def exec(self, argv: list[str], *, env: dict[str, str] | None = None, **_: object) -> ExecResult:
        done = subprocess.run(argv, env=env or {"PATH": os.defpath}, capture_output=True, timeout=60)
        return ExecResult(
            exit_code=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr,
            timed_out=False,
            duration_seconds=0.0,
        )


@pytest.mark.skipif(HOST_PYTHON is None, reason="no Python 3.12 on this host (pyenv's or on PATH)")
async def test_the_hosts_runtime_comes_before_the_sandboxs_own_and_the_hosts_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An install in a store every image shares must not take the Python of the image it was
    made in: the host's, made relocatable, comes first, even where the sandbox has a python3.12
    of its own — and even where the sandbox could run the host's at its path (``local-plain``,
    whose store the isolated ``local``, which does not see the host's pyenv, shares)."""
    uploaded: list[Path] = []

    async def upload(sandbox: object, host: Path, version: str, log: object) -> str:
        uploaded.append(host)
        return "/agents/python3.12-key/bin/python3.12"

    monkeypatch.setattr(python_runtime, "_upload_runtime", upload)
    sees_everything = ProbedSandbox(0, b"/usr/bin/python3.12\n")  # `test -x HOST` would pass
    found = await provide_python(sees_everything, "3.12", {})  # type: ignore[arg-type]
    assert found == "/agents/python3.12-key/bin/python3.12" and uploaded == [HOST_PYTHON]


def fake_python(folder: Path, version: str, *, with_venv: bool) -> None:
    """A ``python<version>`` in `folder` that, like Debian's without ``python3.X-venv``, fails to
    import ensurepip (unless `with_venv`); run with ``-c``, it prints its own path."""
    program = folder / f"python{version}"
    missing = "" if with_venv else "echo \"ModuleNotFoundError: No module named 'ensurepip'\" >&2; exit 1\n"
    program.write_text(f"#!/bin/sh\n{missing}echo {program}\n")
    program.chmod(0o755)


@pytest.mark.spawns
async def test_a_sandbox_python_without_venv_fails_within_seconds_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pythons, "PYENV_VERSIONS", str(tmp_path / "no-pyenv"))
    fake_python(tmp_path, "3.99", with_venv=False)
    env = {"PATH": f"{tmp_path}:{os.defpath}"}
    started = time.monotonic()
    with pytest.raises(AgentInstallError) as raised:
        await provide_python(HostSandbox(), "3.99", env)  # type: ignore[arg-type]
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert "needs Python 3.99 with venv and ensurepip: the host has none to lend it" in message
    assert "python3.99 is missing or lacks them (on Debian: apt-get install python3.99-venv)" in message
    fake_python(tmp_path, "3.99", with_venv=True)
    assert await provide_python(HostSandbox(), "3.99", env) == str(tmp_path / "python3.99")  # type: ignore[arg-type]


async def test_without_a_python_in_the_sandbox_or_on_the_host_the_install_fails_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(python_runtime, "host_python", lambda version: None)
    with pytest.raises(
        AgentInstallError, match=r"needs Python 3\.12 with venv and ensurepip: the host has none"
    ):
        await provide_python(ProbedSandbox(127, b""), "3.12", {})  # type: ignore[arg-type]
