"""Red team, issue 32: two rollouts of the isolated `local` sandbox started at once, one attacking
the other's processes, files and System V IPC.

The victim's agent leaves a process running (a ``sleep`` with a marker on its command line), a
file in its workspace and a shared-memory segment of mode 0600 holding a secret; its sidecar
(the sandbox's init) runs as the victim's root. The attacker tries two ways in:

- from inside its own sandbox, as its agent and as its root: find the victim's process in
  ``/proc``, its file through any process's ``/proc/<pid>/root``, its segment by key. The
  namespaces (PID, mount, IPC) stop all of it, before and after issue 32;
- as its own host ids outside its namespaces (what a kernel escape or a leaked host descriptor
  would give it), its root against the victim's root and its agent against the victim's agent:
  signal the victim's sidecar and agent, read the sidecar's ``/proc/<pid>/environ``, write the
  root's file through ``/proc/<pid>/root``, join the victim's user namespace, and, from inside the
  victim's IPC namespace, attach the agent's segment. The test's controls show
  each works for the victim's own ids. Before each sandbox had a host id range of its own
  (`reroll.sandbox.local.identity`), both sandboxes' roots were host uid 100000 and both agents
  101000, and every one of these succeeded; now each fails.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import pytest
from reroll import conformance
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.local import rootview
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.rootview import AGENT_ID
from reroll.tasks.task import load_task

from tests.conftest import EXAMPLES
from tests.sandbox.local.host_ids import as_user, host_pid, uids

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
]
PYTHON = "/usr/bin/python3"
"""The host's system interpreter: readable by every host user, and the sandboxes' (the host's /usr)."""
SHM_KEY = 0x52523332
MAKE_SEGMENT = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
segment = libc.shmget(int(sys.argv[1]), 4096, 0o1600)  # IPC_CREAT, owner only
assert segment >= 0, ctypes.get_errno()
ctypes.memmove(libc.shmat(segment, None, 0), sys.argv[2].encode(), len(sys.argv[2]))
"""
ATTACH = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
segment = libc.shmget(int(sys.argv[1]), 0, 0)
if segment < 0:
    sys.exit(f"shmget: {os.strerror(ctypes.get_errno())}")
address = libc.shmat(segment, None, 0o10000)  # SHM_RDONLY
if address in (None, ctypes.c_void_p(-1).value):
    sys.exit(f"shmat: {os.strerror(ctypes.get_errno())}")
print(ctypes.string_at(address, 64).split(b"\0")[0].decode())
"""
HUNT = r"""
import ctypes, json, os, sys
marker, name = str(int(sys.argv[1]) + 1), sys.argv[2]  # not on its own command line
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if marker.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            found.append(f"process {pid}")
        for folder in ("/", os.getcwd()):
            if os.path.exists(f"/proc/{pid}/root{folder}/{name}"):
                found.append(f"file via /proc/{pid}/root{folder}")
    except OSError:
        pass
segment = ctypes.CDLL(None, use_errno=True).shmget(int(sys.argv[3]), 0, 0)
if segment >= 0:
    found.append(f"segment {segment}")
print(json.dumps(found))
"""


async def test_two_concurrent_rollouts_cannot_see_signal_write_or_attach_each_other() -> None:
    spec = sandbox_spec(load_task(EXAMPLES / "hello-file"))
    attacker, victim = IsolatedSandbox(spec, "concurrent-a"), IsolatedSandbox(spec, "concurrent-b")
    try:
        await asyncio.gather(attacker.start(), victim.start())  # at once
        assert attacker.init_pid is not None and victim.init_pid is not None
        roots = {attacker: uids(attacker.init_pid)[0], victim: uids(victim.init_pid)[0]}
        marker, secret, name = (f"{secrets.randbelow(10**6) + 10**6}", secrets.token_hex(8), "victim.txt")
        segment = f"{PYTHON} -c '{MAKE_SEGMENT}' {SHM_KEY} {secret}"
        script = f"echo {secret} > {name}; {segment}; sleep {marker} & echo $!"
        inner = int((await conformance.sh(victim, script, user="agent")).split()[-1])
        target = host_pid(victim.init_pid, inner)
        agent = uids(target)[0]
        for user in ("agent", "root"):  # from inside: the namespaces
            hunt = await conformance.sh(
                attacker, f"{PYTHON} -c '{HUNT}' {int(marker) - 1} {name} {SHM_KEY}", user=user
            )
            assert json.loads(hunt) == [], f"the attacker's {user} found {hunt}"
        await conformance.sh(victim, f"echo {secret} > root-{name}")  # a file of the victim's root
        inside = f"/proc/{victim.init_pid}/root{victim.layout.workspace}"
        ipc = ("nsenter", f"--ipc=/proc/{victim.init_pid}/ns/ipc")
        attacks = {  # what the victim's root, then its agent, may do to its own
            roots[victim]: {
                "signal the sidecar": ("kill", "-0", str(victim.init_pid)),
                "read the sidecar's environ": ("cat", f"/proc/{victim.init_pid}/environ"),
                "write the root's file": ("sh", "-c", f"echo forged >> {inside}/root-{name}"),
                "join the sandbox's user namespace": (
                    "nsenter",
                    f"--user=/proc/{victim.init_pid}/ns/user",
                    "true",
                ),
            },
            agent: {
                "signal the agent's process": ("kill", "-0", str(target)),
                "attach the agent's segment": (PYTHON, "-c", ATTACH, str(SHM_KEY)),
            },
        }
        for own, mine in attacks.items():  # the controls: each works for the victim's own identity
            for label, argv in mine.items():
                done = as_user(own, *argv, prefix=ipc if "segment" in label else ())
                assert done.returncode == 0, (label, done)
        succeeded, peers = [], {roots[victim]: roots[attacker], agent: roots[attacker] + AGENT_ID}
        for own, mine in attacks.items():  # the attacker's root at the victim's, its agent at the agent
            for label, argv in mine.items():
                done = as_user(peers[own], *argv, prefix=ipc if "segment" in label else ())
                if done.returncode == 0:
                    succeeded.append(f"{label} as host uid {peers[own]}: {done.stdout[:40]!r}")
        assert roots[attacker] != roots[victim] and not succeeded, (roots, succeeded)
        assert (Path(inside) / f"root-{name}").read_text() == f"{secret}\nforged\n"  # the control's write
    finally:
        await asyncio.gather(attacker.stop(), victim.stop(), return_exceptions=True)
