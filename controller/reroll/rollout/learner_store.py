"""A job's learner store inside one rollout's sandbox: mounted before the agent runs, read back after.

The store's generation (`reroll.runfolder.store`) is copied into the sandbox at `STORE_MOUNT`
(under the sandbox root), owned by the agent's user, so the agent can change it. Its
``skills/`` is linked at every native skill path (`mount_skills_at_native_paths`) and the agent
finds the folders in its environment:

    REROLL_LEARNER_STORE   the store (``skills/`` and ``memory/``)
    REROLL_SKILLS_DIR      its skills: ``<name>/SKILL.md`` each
    REROLL_MEMORY_DIR      its memory files

A copy, not a bind mount: it works on every sandbox backend, and what the agent does to it
never reaches the job folder by itself. After the agent's processes are gone,
`harvest_learner_store` reads the store back (regular files only, found without following a
link) into the job's blobs, when the rollout's `reroll.runfolder.run.StoreUse` writes back; a
continuation or branch mounts its generation the same way and reads nothing back.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from reroll_contracts.errors import SandboxError

from reroll.runfolder.run import StoreHarvest, StoreUse
from reroll.runfolder.store import (
    MAX_STORE_BYTES,
    MAX_STORE_FILE_BYTES,
    MEMORY_DIR,
    SKILLS_DIR,
    check_store_path,
    generation_files,
    load_generation,
    put_blob,
)
from reroll.sandbox.base import Sandbox

STORE_MOUNT = "/opt/reroll/learner-store"
"""Where the learner store is in the sandbox (under its root)."""
NATIVE_SKILL_PATHS = ("~/.claude/skills", "~/.agents/skills", "~/.codex/skills")
"""Where agents read skills (``<name>/SKILL.md``): Claude Code; Codex (and the older path)."""
STORE_SETUP_TIMEOUT_SECONDS = 60.0


async def mount_learner_store(sandbox: Sandbox, use: StoreUse, env: Mapping[str, str]) -> dict[str, str]:
    """Copy generation ``use.generation`` of the store into `sandbox`, give it to the agent's
    user, and link its skills at the native skill paths.

    Args:
        sandbox: the started sandbox, the agent installed.
        use: the store and generation (config.json's ``learner_store``).
        env: the base environment of the sandbox's processes (HOME, PATH).

    Returns:
        The environment variables naming the store's folders (module docstring), for the agent.

    Raises:
        StoreError: the generation or one of its blobs is missing or corrupt.
        SandboxError: a file could not be written, or the folders not set up.
    """
    store = Path(use.path)
    files = generation_files(store, load_generation(store, use.generation))
    root = sandbox.layout.path(STORE_MOUNT)
    for path, data in files.items():
        await sandbox.put_file(f"{root}/{path}", data, 0o644)
    skills, memory = f"{root}/{SKILLS_DIR}", f"{root}/{MEMORY_DIR}"
    script = f"mkdir -p {shlex.quote(skills)} {shlex.quote(memory)}"
    if user := sandbox.layout.agent_user:  # our own fresh files: no link of the agent's yet
        script += f" && chown -R {shlex.quote(user)}: {shlex.quote(root)}"
    await _exec(sandbox, script, env, "")
    await mount_skills_at_native_paths(sandbox, skills, env)
    return {"REROLL_LEARNER_STORE": root, "REROLL_SKILLS_DIR": skills, "REROLL_MEMORY_DIR": memory}


async def mount_skills_at_native_paths(sandbox: Sandbox, skills_dir: str, env: Mapping[str, str]) -> None:
    """Make every path of `NATIVE_SKILL_PATHS` (in the agent's HOME) a link to `skills_dir`,
    replacing what was there; run as the agent's user, so nothing root-side follows its links.

    Raises:
        SandboxError: the links could not be made.
    """
    lines = ["set -e"]
    for native in NATIVE_SKILL_PATHS:
        path = '"$HOME"/' + shlex.quote(native.removeprefix("~/"))
        target = shlex.quote(skills_dir)
        lines.append(f'mkdir -p "$(dirname {path})" && rm -rf {path} && ln -s {target} {path}')
    await _exec(sandbox, "\n".join(lines), env, sandbox.layout.agent_user)


async def harvest_learner_store(sandbox: Sandbox, store: Path) -> StoreHarvest:
    """Read the learner store back from `sandbox` (its agent's processes gone) into `store`'s blobs.

    Regular files only, listed by the sandbox's manifest (which follows no link); a symlink, FIFO
    or device, a path that is not clean, a file over `MAX_STORE_FILE_BYTES` or past
    `MAX_STORE_BYTES` in all is left out, and listed as such.

    Returns:
        The store's files (``{path: sha256}``) and what was left out.

    Raises:
        SandboxError: a file could not be read, or the sandbox died.
    """
    root = sandbox.layout.path(STORE_MOUNT)
    check = await sandbox.exec(["sh", "-c", 'test -d "$1" && test ! -L "$1"', "check", root])
    if check.exit_code != 0:
        return StoreHarvest(files={}, left_out=[f"{STORE_MOUNT}: removed, or replaced by a non-folder"])
    manifest = await sandbox.manifest(root)
    files: dict[str, str] = {}
    left_out: list[str] = []
    total = 0
    for path, value in manifest.items():
        try:
            check_store_path(path)
        except ValueError as exc:
            left_out.append(f"{path}: {exc}")
            continue
        if ":" in value:  # "symlink:<target>", "fifo:", "unreadable:<why>" …
            left_out.append(f"{path}: {value.split(':', 1)[0]}")
            continue
        data = await sandbox.get_file(f"{root}/{path}")
        if len(data) > MAX_STORE_FILE_BYTES or total + len(data) > MAX_STORE_BYTES:
            left_out.append(f"{path}: {len(data)} bytes, past the store's size limits")
            continue
        total += len(data)
        files[path] = put_blob(store, data)
    return StoreHarvest(files=files, left_out=left_out)


async def _exec(sandbox: Sandbox, script: str, env: Mapping[str, str], user: str) -> None:
    result = await sandbox.exec(
        ["sh", "-c", script],
        env=env,
        inherit_env=False,
        user=user,
        timeout_seconds=STORE_SETUP_TIMEOUT_SECONDS,
    )
    if result.exit_code != 0:
        raise SandboxError(f"setting up the learner store failed: {result.output_text()[-2000:]}")
