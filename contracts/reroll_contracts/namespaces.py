"""Linux's namespace flags (``<linux/sched.h>``; Python's `os` has them only from 3.12, and the
sidecar runs on whatever Python a sandbox has), and the set a verify runs in: the sidecar's
launcher unshares them (`reroll_sidecar.verify_ns`) and docker's seccomp profile allows exactly
them (`reroll.sandbox.docker.seccomp`)."""

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
VERIFY_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWUTS
"""A verify's own user, mount, IPC, PID and UTS namespaces (its network is the sandbox's, unless
the verifier's network policy is stricter than the agent's: then `CLONE_NEWNET` too)."""
VERIFY_NAMESPACES_OWN_NET = VERIFY_NAMESPACES | CLONE_NEWNET
"""Every namespace a verify may make: docker's seccomp profile allows exactly these."""
