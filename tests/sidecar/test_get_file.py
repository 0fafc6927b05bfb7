"""Red team, issue 32: GetFile runs as root on paths the agent can write.

The agent replaces a file the controller fetches (``reward.txt``, a verifier log) by a symlink to
a root-only file, a FIFO nobody writes, or a 2 GiB sparse file. GetFile must refuse the first two
(never following the link, never waiting on the FIFO) and refuse the third whole unless the
caller asked for its start (``max_bytes``). Before the fix, GetFile used a plain ``open``: it
returned the link's target, blocked on the FIFO until the deadline, and streamed 2 GiB.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reroll.sandbox.sidecar_client import SidecarClient
from reroll_contracts.errors import SidecarError

pytestmark = pytest.mark.timeout(30)


async def test_get_file_follows_no_symlink(client: SidecarClient, tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("the hidden tests")
    secret.chmod(0o600)
    reward = tmp_path / "reward.txt"
    reward.symlink_to(secret)
    with pytest.raises(SidecarError, match=r"FAILED_PRECONDITION.*reward\.txt: a symlink; not followed"):
        await client.get_file(str(reward))


async def test_get_file_waits_on_no_fifo(client: SidecarClient, tmp_path: Path) -> None:
    fifo = tmp_path / "reward.txt"
    os.mkfifo(fifo)
    with pytest.raises(SidecarError, match=r"reward\.txt: not a regular file"):
        await client.get_file(str(fifo))


async def test_get_file_refuses_a_file_past_its_cap_unless_asked_for_its_start(
    client: SidecarClient, tmp_path: Path
) -> None:
    sparse = tmp_path / "verifier.log"
    with open(sparse, "wb") as file:
        file.truncate(2 * 1024**3)
    with pytest.raises(SidecarError, match=r"verifier\.log: 2147483648 bytes, more than the cap"):
        await client.get_file(str(sparse))
    assert await client.get_file(str(sparse), max_bytes=5) == b"\0" * 5
