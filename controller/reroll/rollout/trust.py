"""A run folder is data: the code a recorded run names runs on the host only when the user names
it again.

A continuation, replay, rescore or branch starts from a run folder that may come from anyone (a
shared folder, a downloaded job). Its ``config.json`` names code the original run imported on the
host: a trial scene's User (``path/to/user.py:attribute`` or ``package.module:attribute``, which
`reroll.trials.users.load_user` imports and calls) and an out-of-tree sandbox backend (a dotted
path, which `reroll.sandbox.base.load_backend` imports). `refuse_untrusted` refuses, before
anything is imported, every such name the user did not trust again with ``--trust`` (the settings'
``trust``): a file by its path, a module or class by its dotted name. What the user types on
the command line for a new recording (``--user``, a trial file, ``--sandbox``) needs no trust:
they named it themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from reroll_contracts.errors import UntrustedCodeError

from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import RunConfig
from reroll.sandbox.base import BACKENDS


def recorded_code(config: RunConfig) -> list[tuple[str, str]]:
    """The host code `config` (a recorded run's config.json) names, as ``(what, target)``: a
    User's file path or module, an out-of-tree sandbox backend's dotted path."""
    found: list[tuple[str, str]] = []
    for scene in config.trial.scenes if config.trial is not None else []:
        if scene.user is not None:
            found.append((f"the User {scene.user} of scene {scene.name!r}", scene.user.rpartition(":")[0]))
    if config.sandbox not in BACKENDS:
        target = config.sandbox.partition(":")[0] if ":" in config.sandbox else config.sandbox
        found.append((f"the sandbox backend {config.sandbox}", target))
    return found


def refuse_untrusted(config: RunConfig, run_dir: Path, trusted: Iterable[str]) -> None:
    """Refuse a rollout from the recorded run at `run_dir` whose config.json names host code
    that `trusted` (``--trust`` values: file paths, module or class names) does not name.

    A file target is trusted by a ``--trust`` path that resolves to the same file (a relative
    target is read from the folder reroll runs in, as the original did); a module target by its
    dotted name or a dotted prefix of it (``--trust mypkg`` trusts ``mypkg.users``).

    Raises:
        UntrustedCodeError: a target not trusted; the message names it, the file, and the flag.
    """
    trusted = list(trusted)
    files = {Path(value).resolve() for value in trusted}
    for what, target in recorded_code(config):
        if target.endswith(".py"):
            if Path(target).resolve() in files:
                continue
        elif any(target == name or target.startswith(f"{name}.") for name in trusted):
            continue
        raise UntrustedCodeError(
            f"{RunPaths(run_dir).config} names {what}: code a run folder names never runs on the host "
            f"unless you name it again; review {target} and pass --trust {target} to run it"
        )
