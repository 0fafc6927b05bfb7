"""The environment's state, and the other state a checkpoint copies out of a sandbox: snapshot →
restore → query (the Environment contract's state half; DESIGN.md, "The environment plane").

A `StateSpec` (``[environment.state]``) says what the state is; every step runs in the sandbox
as root, on the root side (never as the agent), through the sidecar's exec and file transfer:

- ``sqlite``: each database copied through SQLite's online backup API (``sqlite3.Connection.backup``,
  in the sandbox's ``python3``), restored through it too (into the open database, in place);
- ``files``: the folders and files copied whole (a tar of them; symlinks stored as symlinks);
- ``command``: the task's ``snapshot_command`` writes the state into ``$REROLL_STATE_DIR`` (a fresh
  root-only folder), which is copied as ``files``; ``restore_command`` reads it back from there.

A snapshot is one tar file's bytes (`StateCopy.data`) that the caller stores on the host (a
checkpoint layer, `reroll.rollout.layers`), so it can be restored into another sandbox. Its
`StateCopy.digest` is a digest of the content (`reroll.environment.state_script`), equal after a
restore; a checkpoint compares them.

Root-side steps never follow the agent's links: a state path any of whose components is a
symbolic link is refused (`EnvironmentStateError`), and nothing is dereferenced inside a copied
folder. They run only while no process of the agent is alive (after quiescing, or before the
agent starts).
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from reroll_contracts.errors import EnvironmentStateError

from reroll.sandbox.base import Sandbox
from reroll.tasks.environment import StateSpec

SCRIPT = (Path(__file__).parent / "state_script.py").read_text()
"""The root-side script, sent into the sandbox with each request."""
STATE_TIMEOUT_SECONDS = 600.0
"""The time a snapshot, restore or digest of the state may take in the sandbox."""
QUERY_TIMEOUT_SECONDS = 120.0
"""The time `query_state`'s command may take."""

CopyKind = Literal["sqlite", "files"]


@dataclass(frozen=True)
class StateCopy:
    """A snapshot taken out of a sandbox."""

    data: bytes
    """A tar file: the copies and ``state.json`` (the paths and which were present)."""
    digest: str
    """sha256 hex of the content at the time of the copy (`reroll.environment.state_script`)."""


async def snapshot_paths(
    sandbox: Sandbox, kind: CopyKind, paths: list[str], env: dict[str, str]
) -> StateCopy:
    """Copy `paths` (absolute, in the sandbox) out of `sandbox`, as root.

    Args:
        sandbox: a started sandbox whose agent is quiesced.
        kind: ``sqlite`` (databases, through the backup API) or ``files`` (copied whole).
        paths: absolute paths in the sandbox; an absent one is recorded as absent (a restore
            deletes it).
        env: the environment the sandbox's ``python3`` is found in (PATH).

    Raises:
        EnvironmentStateError: a path (or a folder on its way) is a symbolic link, a database is
            damaged, or the copy failed (the script's message).
    """
    scratch = await _scratch(sandbox, env)
    try:
        out = f"{scratch}/state.tar"
        answer = await _run(sandbox, {"op": "pack", "kind": kind, "paths": paths, "out": out}, env)
        return StateCopy(await sandbox.get_file(out), answer["digest"])
    finally:
        await _remove(sandbox, scratch, env)


async def restore_paths(
    sandbox: Sandbox, kind: CopyKind, paths: list[str], copy: bytes, env: dict[str, str]
) -> str:
    """Put a `snapshot_paths` copy of `paths` back into `sandbox`, as root: each path replaced
    whole (``files``), each database restored in place through the backup API (``sqlite``).

    Returns:
        The digest of the restored content (equal to the copy's when it was restored exactly).

    Raises:
        EnvironmentStateError: the copy holds other paths, a path on the way is a symbolic link,
            or the restore failed.
    """
    scratch = await _scratch(sandbox, env)
    try:
        tar = f"{scratch}/state.tar"
        await sandbox.put_file(tar, copy, mode=0o600)
        answer = await _run(sandbox, {"op": "unpack", "kind": kind, "paths": paths, "tar": tar}, env)
        return str(answer["digest"])
    finally:
        await _remove(sandbox, scratch, env)


async def digest_paths(sandbox: Sandbox, kind: CopyKind, paths: list[str], env: dict[str, str]) -> str:
    """The content digest of `paths` as they are now (as `StateCopy.digest`).

    Raises:
        EnvironmentStateError: as `snapshot_paths`.
    """
    answer = await _run(sandbox, {"op": "digest", "kind": kind, "paths": paths}, env)
    return str(answer["digest"])


async def snapshot_state(sandbox: Sandbox, spec: StateSpec, env: dict[str, str]) -> StateCopy:
    """Snapshot the environment's state as `spec` declares it (the module docstring).

    Raises:
        EnvironmentStateError: as `snapshot_paths`; the state lives in a service's own container
            (not supported yet); or the ``snapshot_command`` failed (its exit and output).
    """
    _check_supported(spec)
    if spec.kind != "command":
        return await snapshot_paths(sandbox, spec.kind, spec.paths, env)
    scratch = await _scratch(sandbox, env)
    try:
        folder = f"{scratch}/state"
        await _command(sandbox, spec.snapshot_command or "", folder, env, "snapshot_command", create=True)
        return await snapshot_paths(sandbox, "files", [folder], env)
    finally:
        await _remove(sandbox, scratch, env)


async def restore_state(sandbox: Sandbox, spec: StateSpec, copy: bytes, env: dict[str, str]) -> str:
    """Restore a `snapshot_state` copy into `sandbox` (the same task's, perhaps another sandbox).

    Returns:
        The digest of the restored state: for ``command`` the digest of what the
        ``restore_command`` was given (the command's effect is its own business).

    Raises:
        EnvironmentStateError: as `restore_paths`, or the ``restore_command`` failed.
    """
    _check_supported(spec)
    if spec.kind != "command":
        return await restore_paths(sandbox, spec.kind, spec.paths, copy, env)
    scratch = await _scratch(sandbox, env)
    try:
        folder = f"{scratch}/state"
        # the copy is of the (then) scratch folder: restore it under this sandbox's scratch path
        restored = await restore_paths(sandbox, "files", [folder], _renamed(copy, folder), env)
        await _command(sandbox, spec.restore_command or "", folder, env, "restore_command", create=False)
        return restored
    finally:
        await _remove(sandbox, scratch, env)


async def query_state(sandbox: Sandbox, command: str, env: dict[str, str]) -> str:
    """Run the task's state ``query_command`` as root in `sandbox` and return its stdout: what the
    verifier receives of the environment's state (written to its folder's
    `reroll.runfolder.paths.STATE_QUERY_FILE`).

    Raises:
        EnvironmentStateError: the command exited non-zero or timed out (its output's tail named).
    """
    result = await sandbox.exec(["sh", "-c", command], env=env, timeout_seconds=QUERY_TIMEOUT_SECONDS)
    if result.exit_code != 0:
        raise EnvironmentStateError(
            f"environment.state.query_command failed (exit {result.exit_code}): "
            f"{result.output_text()[-1000:]}"
        )
    return result.stdout.decode(errors="replace")


def _check_supported(spec: StateSpec) -> None:
    if spec.service is not None:
        raise EnvironmentStateError(
            f"environment.state.service = {spec.service!r}: state inside a service's own container "
            "cannot be snapshotted yet; keep the state in the sandbox (a command service)"
        )


def _renamed(copy: bytes, folder: str) -> bytes:
    """A ``files`` copy of one folder, with its recorded path replaced by `folder` (the tar's
    ``state.json``), so a ``command`` state restores under another scratch folder."""
    source, target = io.BytesIO(copy), io.BytesIO()
    with tarfile.open(fileobj=source) as tar_in, tarfile.open(fileobj=target, mode="w") as tar_out:
        for member in tar_in.getmembers():
            if member.name == "state.json":
                index = json.load(tar_in.extractfile(member) or io.BytesIO(b"{}"))
                data = json.dumps({**index, "paths": [folder]}).encode()
                member.size = len(data)
                tar_out.addfile(member, io.BytesIO(data))
            else:
                tar_out.addfile(member, tar_in.extractfile(member) if member.isfile() else None)
    return target.getvalue()


async def _command(
    sandbox: Sandbox, command: str, folder: str, env: dict[str, str], field: str, *, create: bool
) -> None:
    prefix = f"mkdir -m 700 {shlex.quote(folder)} && " if create else ""
    result = await sandbox.exec(
        ["sh", "-c", prefix + command],
        env={**env, "REROLL_STATE_DIR": folder},
        timeout_seconds=STATE_TIMEOUT_SECONDS,
    )
    if result.exit_code != 0:
        raise EnvironmentStateError(
            f"environment.state.{field} failed (exit {result.exit_code}): {result.output_text()[-1000:]}"
        )


async def _run(sandbox: Sandbox, request: dict[str, object], env: dict[str, str]) -> dict[str, str]:
    result = await sandbox.exec(
        ["python3", "-c", SCRIPT],
        env=env,
        stdin=json.dumps(request).encode(),
        timeout_seconds=STATE_TIMEOUT_SECONDS,
    )
    if result.exit_code != 0:
        raise EnvironmentStateError(
            f"{request['op']} of state {request['paths']} ({request['kind']}) failed: "
            f"{result.stderr.decode(errors='replace').strip()[-1000:] or f'exit {result.exit_code}'}"
        )
    answer: dict[str, str] = json.loads(result.stdout)
    return answer


async def _scratch(sandbox: Sandbox, env: dict[str, str]) -> str:
    """A fresh root-only folder in the sandbox's /tmp (``mktemp -d``: never an existing path)."""
    result = await sandbox.exec(["mktemp", "-d", "/tmp/reroll-state.XXXXXXXX"], env=env)
    if result.exit_code != 0:
        raise EnvironmentStateError(f"cannot make a scratch folder in the sandbox: {result.output_text()}")
    return result.stdout.decode().strip()


async def _remove(sandbox: Sandbox, folder: str, env: dict[str, str]) -> None:
    await sandbox.exec(["rm", "-rf", "--", folder], env=env)
