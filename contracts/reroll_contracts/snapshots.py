"""What a snapshot's name may be, for every path that takes one: the sidecar's tar snapshots
(``reroll_sidecar.snapshots``) and the isolated local sandbox's copy-on-write ones
(``reroll.sandbox.local.cow``)."""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
"""A snapshot's name: a letter, digit or ``_`` first, then up to 127 of those, ``.`` and ``-``
(no path separator, never ``.`` or ``..``)."""
