"""A verifier's declared inputs (BenchFlow's ``inputs`` of an ``ors-episode`` or ``agent-judge``
strategy), found on the host.

An input is a path relative to the run folder (``trajectory/llm_trajectory.jsonl``), or an
absolute path: one under ``/logs`` is looked for in the run folder first (``/logs/verifier/x`` →
``verifier/x``), any other (or one the run folder lacks) is read from the sandbox — after the
agent's processes are killed — into a file of the verifier's own folder.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from reroll_contracts.errors import SandboxError, VerifierError

from reroll.rollout.verify.verifiers import VerifyRequest
from reroll.runfolder.paths import RunPaths

MAX_INPUT_BYTES = 64 * 1024 * 1024
"""The most of one input file read from the sandbox, in bytes (a longer one is refused)."""


async def input_file(request: VerifyRequest, declared: str, folder: Path, index: int, what: str) -> Path:
    """The host file of the input `declared` (the `index`-th): in the run folder, else read from
    the sandbox into `folder` (created) as ``<index>-<its path's parts joined by __>``.

    Args:
        what: what to call it in messages (``ors-episode input``).

    Raises:
        VerifierError: a relative input the run folder lacks, or a sandbox file that is missing,
            not a regular file or over `MAX_INPUT_BYTES` (the message names `declared`).
    """
    path = PurePosixPath(declared)
    in_run = path.relative_to("/logs") if path.is_relative_to("/logs") else path
    if not in_run.is_absolute() and in_run.parts and RunPaths(request.run_dir).file(in_run).is_file():
        return RunPaths(request.run_dir).file(in_run)
    if not path.is_absolute():
        raise VerifierError(f"{what} {declared!r} was not found in the run folder {request.run_dir}")
    layout = request.sandbox.layout
    inside = f"{layout.logs_dir}/{in_run}" if in_run != path else layout.path(declared)
    try:
        data = await request.sandbox.get_file(inside, max_bytes=MAX_INPUT_BYTES + 1)
    except (FileNotFoundError, SandboxError) as exc:
        raise VerifierError(f"{what} {declared!r} cannot be read from the sandbox: {exc}") from exc
    if len(data) > MAX_INPUT_BYTES:
        raise VerifierError(f"{what} {declared!r} is larger than {MAX_INPUT_BYTES} bytes")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{index}-{'__'.join(part for part in path.parts if part != '/') or 'input'}"
    target.write_bytes(data)
    return target
