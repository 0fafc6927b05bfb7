"""Host-side settings read from the environment, in one place."""

from __future__ import annotations

import contextlib
import fcntl
import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

from reroll_contracts.errors import ConfigError

IMAGE_BUILDS_DEFAULT = 2


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


def image_builds() -> int:
    """How many image builds may run at once on this host, across processes:
    ``$REROLL_IMAGE_BUILDS``, else `IMAGE_BUILDS_DEFAULT` (each build of a task image is a
    ``docker build``, each catalogue image a debootstrap; both are mostly I/O and downloads).

    Raises:
        ConfigError: the variable is not a whole number of at least 1.
    """
    text = os.environ.get("REROLL_IMAGE_BUILDS", "").strip()
    if not text:
        return IMAGE_BUILDS_DEFAULT
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"REROLL_IMAGE_BUILDS={text}: expected a whole number of at least 1 (builds at once)"
        )
    return int(text)


def build_timeout_multiplier() -> float:
    """How many times its own ``environment.build_timeout_sec`` a task's image build may take on
    this host: ``$REROLL_BUILD_TIMEOUT_MULTIPLIER``, else 1 (Harbor's
    ``--environment-build-timeout-multiplier``: a task's limit is set on its author's machine; a
    slower or busier one needs more).

    Raises:
        ConfigError: the variable is not a number greater than 0.
    """
    text = os.environ.get("REROLL_BUILD_TIMEOUT_MULTIPLIER", "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(
            f"REROLL_BUILD_TIMEOUT_MULTIPLIER={text}: expected a number greater than 0 (times the task's "
            f"build_timeout_sec)"
        )
    return value


@contextlib.contextmanager
def cache_slot(name: str, slots: int, poll_seconds: float = 0.2) -> Iterator[int]:
    """Hold one of `slots` exclusive locks ``<cache>/<name>.slot-<i>.lock`` (blocking until one
    is free, trying each every `poll_seconds`); yields its index ``i`` (0 ≤ i < `slots`). So at
    most `slots` holders at once, across threads and processes (each try opens the file anew:
    flock locks of separate opens exclude each other in one process too); a holder that dies
    frees its slot. Processes that disagree on `slots` share the slots they have in common."""
    folder = cache_dir() / Path(name).parent
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        for index in range(slots):
            handle = open(cache_dir() / f"{name}.slot-{index}.lock", "w")  # noqa: SIM115 (closed below)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield index
            finally:
                handle.close()
            return
        time.sleep(poll_seconds)
