"""The isolated local sandbox's root view as bwrap arguments, and its resolv.conf (no process started)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from reroll.sandbox.local.identity import SLOT_ID_START
from reroll.sandbox.local.rootview import DNS_FORWARD, Piece, RootView, sandbox_resolv_conf


def test_a_loopback_resolver_becomes_pastas_forwarded_address() -> None:
    host = "search example.org\nnameserver 127.0.0.53\noptions edns0\n"
    assert sandbox_resolv_conf(host) == f"nameserver {DNS_FORWARD}\nsearch example.org\noptions edns0\n"
    assert sandbox_resolv_conf("nameserver 10.0.0.2\n") == "nameserver 10.0.0.2\n"
    assert sandbox_resolv_conf("") == ""


@pytest.mark.skipif(not all(map(shutil.which, ("bwrap", "setpriv", "unshare"))), reason="needs bwrap")
@pytest.mark.skipif(os.geteuid() != 0, reason="chowns the staging folders: needs root")
def test_the_command_maps_no_admin_capability_and_stages_root_only_pieces(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    view = RootView(
        folder=tmp_path,
        hostname="sandbox",
        storage_bytes=1 << 30,
        id_base=SLOT_ID_START,
        pieces=[
            Piece("/root/.cache/reroll/agents", "/root/.cache/reroll/agents", staged=True),
            Piece(str(tmp_path / "app"), "/srv/deep/app", writable=True),
        ],
    )
    argv = view.command(["/opt/reroll-sidecar/reroll-sidecar"], info_fd=5, block_fd=6)
    assert argv[:4] == [shutil.which("unshare"), "--mount", "--propagation", "private"]
    script = argv[argv.index("-c") + 1]
    assert script.startswith(f"mount --bind -o ro /root/.cache/reroll/agents {tmp_path}/.stage/0 && ")
    caps = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--cap-add"]
    assert "CAP_SYS_ADMIN" not in caps and "CAP_SYS_PTRACE" not in caps and "CAP_SETUID" in caps
    assert (
        "--ro-bind" in argv
        and ["--size", str(1 << 30), "--perms", "0755", "--tmpfs", "/"]
        == argv[argv.index("--size") : argv.index("--size") + 6]
    )
    made = [argv[i + 3] for i, arg in enumerate(argv) if arg == "--perms" and argv[i + 2] == "--dir"]
    assert "/srv" in made and "/srv/deep" in made  # parents made 0755, not bwrap's 0700
    assert f"--reuid={view.id_base}" in argv
