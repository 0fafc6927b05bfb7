"""The conformance checks every `Sandbox` backend must pass — reroll's own and any out of tree.

Each check is an async function ``check(factory, workdir)``: it builds a small probe task in
the host folder `workdir`, makes sandboxes with ``factory(spec, run_id)`` (``spec``: the probe task's
`reroll.rollout.sandbox_spec.sandbox_spec`; a backend class, or
``functools.partial(create_sandbox, "local")``), drives them only through the `Sandbox`
protocol, and raises `ConformanceError` (an AssertionError) naming what the backend got wrong.
Every sandbox a check starts is stopped again, also when it fails. The checks live in
`processes` (lifecycle, exec, kill, files), `snapshots` and `verification`; `CHECKS` lists them all.

From pytest (one test per check; needs pytest-asyncio or anyio for the async test)::

    import pytest
    from reroll import conformance
    from mypackage.backends import MySandbox

    @pytest.mark.parametrize("check", conformance.CHECKS, ids=conformance.check_name)
    async def test_my_sandbox(check: conformance.Check, tmp_path) -> None:
        await check(MySandbox, tmp_path)

Without pytest: ``failures = await conformance.self_check(MySandbox)`` returns
``{check name: what failed}``, empty when the backend conforms.
"""

from __future__ import annotations

import tempfile
import traceback
from pathlib import Path

from reroll.conformance import processes, snapshots, verification
from reroll.conformance.snapshots import restore_hard_cases
from reroll.conformance.support import (
    BACKGROUND_SLEEP,
    Check,
    ConformanceError,
    probe_task,
    sh,
    started,
)
from reroll.sandbox.base import SandboxFactory

__all__ = [
    "BACKGROUND_SLEEP",
    "CHECKS",
    "Check",
    "ConformanceError",
    "check_name",
    "probe_task",
    "restore_hard_cases",
    "self_check",
    "sh",
    "started",
]

CHECKS: tuple[Check, ...] = (
    processes.check_lifecycle,
    processes.check_exec_streams_output_exit_code_and_environment,
    processes.check_exec_of_a_missing_program_ends_with_127,
    processes.check_timeout_kills_the_whole_process_group,
    processes.check_kill_ends_what_exec_started,
    processes.check_the_agent_user_runs_commands_in_a_writable_workspace,
    processes.check_files_round_trip_with_modes,
    snapshots.check_restore_puts_back_contents_modes_symlinks_and_deletions,
    snapshots.check_restore_gets_types_owners_permissions_links_and_names_right,
    snapshots.check_snapshot_of_named_paths_records_absent_ones,
    snapshots.check_restore_of_an_unknown_snapshot_or_bad_name_fails_clearly,
    snapshots.check_manifest_hashes_files_and_follows_no_link,
    verification.check_verify_scores_the_workspace_and_undoes_planted_hooks,
    verification.check_verify_runs_the_script_in_a_clean_environment,
    verification.check_verify_honours_the_tasks_opt_outs,
    verification.check_verify_timeout_kills_the_scripts_process_group,
    verification.check_verify_names_a_missing_test_script,
    verification.check_verify_without_prepare_fails_clearly,
    processes.check_a_long_run_name_still_starts,
)
"""Every conformance check, in the order `self_check` runs them."""


def check_name(check: Check) -> str:
    """A check's short name (its function name without ``check_``), e.g. for pytest ids."""
    return getattr(check, "__name__", repr(check)).removeprefix("check_")


async def self_check(factory: SandboxFactory, checks: tuple[Check, ...] = CHECKS) -> dict[str, str]:
    """Run `checks` against the backend `factory` makes, one after another, each in a fresh
    temporary folder, and collect what failed.

    Returns:
        ``{check name: the failure (message, or the traceback of an unexpected exception)}``;
        empty when the backend passed every check.
    """
    failures: dict[str, str] = {}
    for check in checks:
        with tempfile.TemporaryDirectory(prefix="reroll-conformance-") as workdir:
            try:
                await check(factory, Path(workdir))
            except ConformanceError as exc:
                failures[check_name(check)] = str(exc)
            except Exception:
                failures[check_name(check)] = traceback.format_exc()
    return failures
