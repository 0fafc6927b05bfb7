"""Host-side settings read from the environment, in one place."""

from __future__ import annotations

import contextlib
import fcntl
import os
import ssl
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """reroll's cache folder.

    ``$REROLL_CACHE_DIR``, else ``$XDG_CACHE_HOME/reroll``, else ``~/.cache/reroll``.

    Holds installed agents (``agents/``); safe to delete, it is rebuilt on demand.
    """
    if env := os.environ.get("REROLL_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reroll"


def host_ca_bundle() -> Path | None:
    """The CA bundle the host trusts (``$PIP_CERT``, ``$SSL_CERT_FILE``, else OpenSSL's default), if any."""
    candidates = [os.environ.get(name) for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")]
    candidates.append(ssl.get_default_verify_paths().openssl_cafile)
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def host_cpus() -> int:
    """How many CPUs this process may run on (its affinity mask: what a container engine on this
    host offers too)."""
    return len(os.sched_getaffinity(0))


def host_memory_mb() -> int:
    """This host's physical memory in MiB."""
    return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) >> 20


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the exclusive lock ``<cache>/<name>.lock`` (blocking), so that concurrent processes
    do a one-time job (an image build, an install) once, one after the other."""
    path = cache_dir() / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
