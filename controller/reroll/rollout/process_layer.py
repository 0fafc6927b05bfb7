"""A checkpoint's fourth layer, ``process``: the agent's process tree, checkpointed with CRIU
(`reroll.sandbox.local.criu`), for agents that keep their conversation only in their memory
(`reroll.agents.AgentSpec.process_checkpoint`: mini-swe-agent).

A branch's rebuilt prefix (``reroll branch --via snapshot``) dumps the tree while the proxy holds
its request at the cut (`dump_process`, before the file layers are copied; the tree waits for
its model meanwhile, so the files it holds open keep their size), into the checkpoint folder::

    process.json          ProcessLayer: the tree's root, the proxy's address, port and token it
                          talks to, its output pipes, the files it holds open (their copy's
                          sha256 and digest), the dump's seconds and the images' size
    process/              CRIU's images
    process-files.tar     the files it holds open, at their size at the dump (its log in
                          /logs/agent), in `reroll.environment.state`'s format

Each child, after the file layers, puts those files back (`restore_process_files`), forwards the
original's proxy address inside to its own proxy (`IsolatedSandbox.alias_host_port`), whose
token is the original's (`ProcessLayer.token`), and instead of launching the agent restores the
tree and waits for it (`run_restored`): the request held at the cut, its connection closed by
the restore, is sent again by the agent's HTTP client, and goes live.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field
from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import EnvironmentStateError, SandboxError

from reroll.environment.state import restore_paths, snapshot_paths
from reroll.runfolder.paths import CheckpointPaths
from reroll.runfolder.run import MAX_JSON_BYTES
from reroll.sandbox.base import Sandbox
from reroll.sandbox.local.criu import Target, dump_tree, find_tree, restore_attached
from reroll.sandbox.local.rootview import AGENT_ID, namespaces_unavailable
from reroll.sandbox.results import STREAMED_TAIL_BYTES, ExecResult

MAX_FILES_BYTES = 1024**3
"""The largest copy of the tree's open files read back."""


class ProcessLayer(BaseModel):
    """``process.json``: what a child needs to restore the tree (the module docstring)."""

    root_pid: int
    """The tree's root, a pid inside the sandbox (the same after the restore)."""
    address: str
    """The proxy's address the agent talks to (the original sandbox's host address)."""
    port: int
    token: str = Field(repr=False)
    """The proxy token the agent presents: a child's proxy takes it as its own."""
    pipes: dict[int, str]
    """The root's output pipes (`reroll.sandbox.local.criu.Tree.pipes`)."""
    open_files: list[str]
    """The files it held open outside the workspace (restored from ``process-files.tar``)."""
    files_sha256: str
    files_digest: str
    """The open files' content digest (`reroll.environment.state.StateCopy.digest`)."""
    images_bytes: int
    dump_seconds: float


def process_fork_refusal(sandbox: str) -> str | None:
    """Why a process checkpoint cannot fork an agent on the sandbox backend named `sandbox`, None
    when it can: ``local`` where user namespaces are allowed (its isolated sandbox)."""
    if sandbox != "local":
        return f"a process checkpoint (CRIU) needs the isolated local sandbox, not {sandbox}"
    refused = namespaces_unavailable()
    return f"a process checkpoint (CRIU) needs user namespaces: {refused}" if refused else None


def _target(sandbox: Sandbox) -> Target:
    if getattr(sandbox, "init_pid", None) is None or not hasattr(sandbox, "alias_host_port"):
        raise SandboxError(f"{sandbox.label}: not an isolated local sandbox: no process checkpoint")
    return sandbox  # type: ignore[return-value]  # an IsolatedSandbox


async def dump_process(
    sandbox: Sandbox, base_url: str, token: str, folder: Path, env: dict[str, str]
) -> tuple[ProcessLayer, bytes]:
    """Dump the agent's tree (started after `reroll.sandbox.local.criu.raise_next_pid`) into
    `folder` (it goes on waiting for its held request: ended by the rollout, never while the
    layers are copied), copy the files it holds open, and write ``process.json``.

    Args:
        sandbox: the running isolated local sandbox; the agent waits for its held request.
        base_url: the proxy's URL the agent was given; token: the token it presents.
        folder: the checkpoint folder (created).
        env: the base environment of processes in the sandbox (PATH).

    Returns:
        The layer and ``process.json``'s bytes (its `LayerRecord` is the caller's).

    Raises:
        SandboxError: no tree found, or CRIU failed (its log's end in the message).
        EnvironmentStateError: the open files could not be copied.
    """
    target = _target(sandbox)
    tree = find_tree(target, target.id_base + AGENT_ID)
    files = CheckpointPaths(folder)
    dumped = await dump_tree(target, tree.root, files.process_images)  # left waiting for its model
    layout = sandbox.layout
    skipped = (layout.workspace, layout.agents_dir)
    kept = [path for path in tree.open_files if not any(_within(path, top) for top in skipped)]
    copy = await snapshot_paths(sandbox, "files", kept, env)
    files.process_files.write_bytes(copy.data)
    url = urllib.parse.urlsplit(base_url)
    assert url.hostname is not None and url.port is not None, base_url
    layer = ProcessLayer(
        root_pid=tree.root, address=url.hostname, port=url.port, token=token, pipes=tree.pipes,
        open_files=kept, files_sha256=hashlib.sha256(copy.data).hexdigest(), files_digest=copy.digest,
        images_bytes=sum(f.stat().st_size for f in files.process_images.iterdir()),
        dump_seconds=dumped.seconds,
    )  # fmt: skip
    data = layer.model_dump_json(indent=2).encode()
    descriptor = os.open(files.process_record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(descriptor, "wb") as out:  # the token: the host's root's alone
        out.write(data)
    return layer, data


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def read_process_layer(folder: Path) -> ProcessLayer | None:
    """The process layer of checkpoint `folder`, None when it has none (no ``process.json``).

    Raises:
        EnvironmentStateError: ``process.json`` is unreadable or malformed.
    """
    path = CheckpointPaths(folder).process_record
    if not path.is_file():
        return None
    try:
        return ProcessLayer.model_validate_json(read_data_file(path, MAX_JSON_BYTES))
    except (OSError, ValueError) as exc:
        raise EnvironmentStateError(f"checkpoint {folder}: cannot read {path.name}: {exc}") from exc


async def restore_process_files(
    sandbox: Sandbox, folder: Path, layer: ProcessLayer, env: dict[str, str], proxy_port: int
) -> None:
    """Put the files the tree held open back into `sandbox` (after the file layers) and forward
    the original's proxy address inside to this sandbox's proxy at `proxy_port`.

    Raises:
        EnvironmentStateError: the copy's sha256 or restored digest differs from the layer's,
            or the sandbox cannot take a restored tree (the cause named).
    """
    files = CheckpointPaths(folder)
    try:
        data = read_data_file(files.process_files, MAX_FILES_BYTES, root=folder)
        target = _target(sandbox)
        if hashlib.sha256(data).hexdigest() != layer.files_sha256:
            raise EnvironmentStateError(f"checkpoint {folder}: {files.process_files.name}'s sha256 changed")
        restored = await restore_paths(sandbox, "files", layer.open_files, data, env)
        await target.alias_host_port(layer.address, layer.port, proxy_port)  # type: ignore[attr-defined]
    except (OSError, ValueError, SandboxError) as exc:
        raise EnvironmentStateError(f"checkpoint {folder}: the agent's process layer: {exc}") from exc
    if restored != layer.files_digest:
        raise EnvironmentStateError(
            f"checkpoint {folder}: the agent's open files restored to {restored[:12]}, "
            f"captured as {layer.files_digest[:12]}"
        )


async def run_restored(
    sandbox: Sandbox,
    folder: Path,
    layer: ProcessLayer,
    on_output: Callable[[str, bytes], None],
    timeout_seconds: float,
) -> ExecResult:
    """Restore the agent's tree of checkpoint `folder` in `sandbox` and wait for it to exit: the
    agent phase's launch of a child forked by process (`reroll.rollout.agent_phase.run_agent`).
    The images are copied to a private folder first (CRIU owns them while it runs).

    Returns:
        As `Sandbox.exec` with `on_output`: the output's tails; the exit code is CRIU's, 0 when
        the tree ran to its end (`reroll.sandbox.local.criu.restore_attached`).

    Raises:
        EnvironmentStateError: the restore failed (CRIU's log's end in the message).
    """
    tails: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def kept(stream: str, chunk: bytes) -> None:
        tails[stream] += chunk
        del tails[stream][:-STREAMED_TAIL_BYTES]
        on_output(stream, chunk)

    scratch = Path(tempfile.mkdtemp(prefix="reroll-criu-"))
    started = time.monotonic()
    try:
        images = scratch / "images"
        shutil.copytree(CheckpointPaths(folder).process_images, images, symlinks=True)
        code, timed_out = await restore_attached(_target(sandbox), images, layer.pipes, kept, timeout_seconds)
    except SandboxError as exc:
        raise EnvironmentStateError(f"restoring the agent's process tree of {folder}: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ExecResult(
        code, bytes(tails["stdout"]), bytes(tails["stderr"]), timed_out, time.monotonic() - started
    )
