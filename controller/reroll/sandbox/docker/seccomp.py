"""The seccomp profile of a rollout's container: Docker's default, plus exactly what a verify's
own namespaces need (`reroll_sidecar.verify_ns`, issue 32).

Docker's default profile (``seccomp-moby-default.json``: moby/profiles v0.2.3, Apache-2.0, its
source in its ``comment``) refuses ``unshare`` and ``mount`` to a container without
``CAP_SYS_ADMIN``, so the sidecar could not give a verify namespaces of its own. `profile`
appends two rules and changes nothing else:

- ``unshare`` with no flag but ``CLONE_NEWUSER``, ``CLONE_NEWNS``, ``CLONE_NEWIPC``,
  ``CLONE_NEWPID``, ``CLONE_NEWUTS`` and ``CLONE_NEWNET`` (a verifier whose network policy is
  stricter than the agent's runs with only loopback; a new network namespace reaches less than
  the container, never more; cgroup and time namespaces stay refused);
- ``mount`` and ``umount2``: the kernel still refuses them to every process without
  ``CAP_SYS_ADMIN`` over the mount namespace's user namespace, i.e. outside a user namespace
  the process made itself, where it sees only what it saw before.

Cost: every process of the container, the agent's included, may now make unprivileged user
namespaces (as on a host that allows them, and as the `local` sandbox allows), which widens the
kernel's attack surface seen from the container; nothing else is granted.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from reroll_contracts.namespaces import VERIFY_NAMESPACES_OWN_NET as VERIFY_FLAGS

OTHER_FLAGS = ~VERIFY_FLAGS & 0xFFFFFFFFFFFFFFFF
"""``unshare``'s flags must have none of these bits: (flags & value) == valueTwo, as Docker's
own ``clone`` rule reads."""
RULES: list[dict[str, object]] = [
    {
        "comment": "reroll: unshare for a verify's own user, mount, IPC, PID, UTS and net namespaces only",
        "names": ["unshare"],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": OTHER_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
    },
    {
        "comment": "reroll: mounts inside such a user namespace (the kernel refuses them elsewhere)",
        "names": ["mount", "umount2"],
        "action": "SCMP_ACT_ALLOW",
    },
]


@functools.cache
def profile() -> str:
    """Docker's default profile with `RULES` appended, as the JSON text ``security_opt`` takes."""
    text = (resources.files("reroll") / "sandbox" / "docker" / "seccomp-moby-default.json").read_text()
    document = json.loads(text)
    document["syscalls"] = [*document["syscalls"], *RULES]
    return json.dumps(document)
