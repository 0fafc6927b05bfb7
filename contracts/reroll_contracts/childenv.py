"""What reroll's own child processes may know: a minimal environment, and no peeking by others.

On the `local` sandbox the agent runs as the controller's user, so everything in an environment
the controller's user can read is the agent's: the environment it inherits from the sidecar, and
``/proc/PID/environ`` of the controller, the proxy and the sidecar (``os.environ.pop`` does not
clear the latter). Two measures:

- `child_environment`: the sidecar and the proxy get only `KEPT` variables of the controller's
  environment (locale, paths, TLS bundles, HTTP proxies, pip/uv settings), never one whose name
  looks secret (`SECRET_NAME`); the proxy gets its provider key as the one extra variable;
- `hide_from_same_user` (the controller, once it starts a local sandbox; the proxy, at start):
  ``prctl(PR_SET_DUMPABLE, 0)`` makes ``/proc/PID/environ``, ``mem`` and ``fd`` root-owned, so
  a process of the same user cannot read them or attach to the process.

Residual risk: until the proxy's interpreter has started and called `hide_from_same_user` (tens
of milliseconds), its environment (with the key) is readable by any process of the user — only
an agent of another rollout already running could race for it; an agent that needs a wall
against its user's processes runs in a container (`docker`) or the isolated local sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
from collections.abc import Mapping

KEPT = re.compile(
    r"PATH|HOME|LANG|LANGUAGE|TZ|TERM|SHELL|USER|LOGNAME|TMPDIR|LC_\w+|XDG_\w+|PYTHON\w*|PIP_\w+|UV_\w+"
    r"|(?i:(HTTPS?|NO|ALL)_PROXY)|SSL_CERT_\w+|\w*CA_BUNDLE|\w*CA_?CERTS\w*|\w+_CAINFO",
)
"""Names of the controller's variables a child keeps (matched in full)."""
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
"""Names never passed on, even when `KEPT` matches (``PIP_INDEX_URL`` may hold a password: kept)."""
PR_SET_DUMPABLE = 4
"""prctl option (linux/prctl.h)."""


def child_environment(
    extra: Mapping[str, str] | None = None, *, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The `KEPT`, non-secret variables of `environ` (default: ``os.environ``), plus `extra`."""
    source = os.environ if environ is None else environ
    kept = {
        name: value for name, value in source.items() if KEPT.fullmatch(name) and not SECRET_NAME.search(name)
    }
    return kept | dict(extra or {})


def hide_from_same_user() -> bool:
    """Make this process non-dumpable (see the module docstring); False where that is impossible.

    Also stops core dumps of this process; children that exec are dumpable again.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    return False
