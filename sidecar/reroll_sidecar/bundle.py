"""The sidecar run as a self-contained bundle (PyInstaller, see `reroll.sandbox.sidecar_bundle`).

In the bundle, ``sys.frozen`` is set and ``sys._MEIPASS`` is the bundle's ``_internal`` folder,
which also holds the GNU find and tar that snapshots run (``tools/``), linked against the
bundle's own C library: nothing of the image is used. Run from a Python installation instead
(the local sandbox, tests), the tools are those on PATH.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

BUNDLE_DIR: str | None = getattr(sys, "_MEIPASS", None) if getattr(sys, "frozen", False) else None
"""The bundle's ``_internal`` folder, None when the sidecar runs from a Python installation."""
BUNDLE_VARIABLES = ("_PYI_", "_MEIPASS")
"""Prefixes of the variables PyInstaller's launcher sets for itself."""


def tool(name: str) -> str:
    """The program `name` (``find``, ``tar``) the sidecar runs: the bundle's copy, else `name` (PATH)."""
    return os.path.join(BUNDLE_DIR, "tools", name) if BUNDLE_DIR else name


def scrub_environment(environ: MutableMapping[str, str] | None = None) -> None:
    """Remove what PyInstaller's launcher added to the environment (``LD_LIBRARY_PATH`` pointing
    into the bundle, ``_PYI_*``), so that the commands the sidecar runs see the image's own
    environment and load the image's libraries. Nothing happens outside a bundle.

    Args:
        environ: the environment to clean; default: ``os.environ``.
    """
    if BUNDLE_DIR is None:
        return
    environ = os.environ if environ is None else environ
    original = environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if original is None:
        environ.pop("LD_LIBRARY_PATH", None)
    else:
        environ["LD_LIBRARY_PATH"] = original
    for name in [name for name in environ if name.startswith(BUNDLE_VARIABLES)]:
        del environ[name]
