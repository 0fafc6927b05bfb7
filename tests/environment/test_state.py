"""The environment's state in a sandbox: snapshot → mutate → restore gives back equal digests for a
SQLite database and a data folder; a link the agent planted on a state path is not followed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from reroll.environment.state import digest_paths, query_state, restore_state, snapshot_state
from reroll.rollout.lifecycle import sandbox_env
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.base import Sandbox, create_sandbox
from reroll.tasks.environment import StateSpec
from reroll.tasks.task import load_task
from reroll_contracts.errors import EnvironmentStateError

from tests.conftest import EXAMPLES

pytestmark = pytest.mark.spawns

SQL = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
connection.executescript(sys.argv[2])
connection.commit()
print(connection.execute("select x from m order by x").fetchall())
"""
"""Runs statements (argument 2) on a database (argument 1) with a table ``m``; prints its rows."""


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    task = load_task(EXAMPLES / "hello-file")
    async with create_sandbox("local", sandbox_spec(task), "state") as started:
        yield started


async def sh(sandbox: Sandbox, command: str, user: str = "") -> str:
    result = await sandbox.exec(["sh", "-c", command], env=sandbox_env(sandbox), user=user)
    assert result.exit_code == 0, result.output_text()
    return result.stdout.decode()


async def sql(sandbox: Sandbox, statements: str) -> str:
    result = await sandbox.exec(
        ["python3", "-c", SQL, "/srv/mail/mail.db", statements], env=sandbox_env(sandbox)
    )
    assert result.exit_code == 0, result.output_text()
    return result.stdout.decode().strip()


async def test_a_sqlite_state_restores_to_its_snapshot(sandbox: Sandbox) -> None:
    env = sandbox_env(sandbox)
    await sh(sandbox, "mkdir -p /srv/mail")
    await sql(sandbox, "create table m(x); insert into m values (1)")
    spec = StateSpec(kind="sqlite", paths=["/srv/mail/mail.db"])
    copy = await snapshot_state(sandbox, spec, env)
    assert await sql(sandbox, "insert into m values (2); delete from m where x = 1") == "[(2,)]"
    assert await digest_paths(sandbox, "sqlite", spec.paths, env) != copy.digest
    assert await restore_state(sandbox, spec, copy.data, env) == copy.digest
    assert await sql(sandbox, "") == "[(1,)]"
    absent = StateSpec(kind="sqlite", paths=["/srv/mail/later.db"])  # not made yet at the snapshot
    before = await snapshot_state(sandbox, absent, env)
    await sh(sandbox, "cp /srv/mail/mail.db /srv/mail/later.db")
    assert await restore_state(sandbox, absent, before.data, env) == before.digest
    assert await sh(sandbox, "ls /srv/mail") == "mail.db\n"


async def test_a_data_folder_restores_to_its_snapshot(sandbox: Sandbox) -> None:
    env = sandbox_env(sandbox)
    await sh(sandbox, "mkdir -p /srv/data/sub && cd /srv/data && echo a > a && echo b > sub/b && ln -s a l")
    spec = StateSpec(kind="files", paths=["/srv/data", "/srv/absent"])
    copy = await snapshot_state(sandbox, spec, env)
    await sh(
        sandbox,
        "echo changed > /srv/data/a && rm -r /srv/data/sub && mkdir /srv/absent && echo x > /srv/data/new",
    )
    assert await digest_paths(sandbox, "files", spec.paths, env) != copy.digest
    assert await restore_state(sandbox, spec, copy.data, env) == copy.digest
    assert (
        await sh(sandbox, "cat /srv/data/a /srv/data/sub/b; readlink /srv/data/l; ls /srv")
        == "a\nb\na\ndata\n"
    )


async def test_a_command_state_and_its_query(sandbox: Sandbox) -> None:
    env = sandbox_env(sandbox)
    await sh(sandbox, "mkdir -p /srv/kv && echo 1 > /srv/kv/value")
    spec = StateSpec(
        kind="command",
        snapshot_command='cp /srv/kv/value "$REROLL_STATE_DIR/value"',
        restore_command='cp "$REROLL_STATE_DIR/value" /srv/kv/value',
    )
    copy = await snapshot_state(sandbox, spec, env)
    await sh(sandbox, "echo 2 > /srv/kv/value")
    await restore_state(sandbox, spec, copy.data, env)
    assert await query_state(sandbox, "cat /srv/kv/value", env) == "1\n"
    with pytest.raises(EnvironmentStateError, match="query_command failed"):
        await query_state(sandbox, "exit 4", env)


async def test_a_state_path_the_agent_made_a_symlink_is_not_followed(sandbox: Sandbox) -> None:
    """The attack: the agent replaces the data folder's parent by a link to a root-only file's
    folder, hoping the root-side copy reads (snapshot) or overwrites (restore) it."""
    env = sandbox_env(sandbox)
    agent = sandbox.layout.agent_user
    await sh(sandbox, "mkdir -p /srv/state /root/secret && echo secret > /root/secret/db && chmod 777 /srv")
    spec = StateSpec(kind="files", paths=["/srv/state/db"])
    copy = await snapshot_state(sandbox, spec, env)
    await sh(sandbox, "rm -r /srv/state && ln -s /root/secret /srv/state", user=agent)
    with pytest.raises(EnvironmentStateError, match="symbolic link"):
        await snapshot_state(sandbox, spec, env)
    with pytest.raises(EnvironmentStateError, match="symbolic link"):
        await restore_state(sandbox, spec, copy.data, env)
    assert await sh(sandbox, "cat /root/secret/db") == "secret\n"
