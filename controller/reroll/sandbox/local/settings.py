"""The isolated `local` backend's settings (``--sandbox-config`` of ``--sandbox local``), validated
once by `reroll.sandbox.base.Backend`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BuilderChoice = Literal["auto", "docker", "buildah"]
"""Which image builder the local sandbox uses for a task's image (`IsolatedSandboxConfig.image_builder`)."""


class IsolatedSandboxConfig(BaseModel):
    """Settings of the isolated `local` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ready_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long `start` waits for the sidecar to answer ready (also the plain fallback's)."""
    storage_bytes: int | None = None
    """The size of the sandbox's writable file system (``/``: workspace, logs, home, ``/tmp``),
    in bytes; None: the task's ``storage_mb``."""
    copy_on_write: bool = True
    """Where btrfs-progs is installed, make ``/`` btrfs and snapshot the workspace and HOME
    copy-on-write (`reroll.sandbox.local.cow`); False: ext4 and the sidecar's tar snapshots
    everywhere (the benches compare the two)."""
    keep_snapshots: bool | None = None
    """With copy-on-write: `IsolatedSandbox.stop` keeps the disk, with only its snapshots, as a pool
    for ``from_snapshot`` (`reroll.sandbox.local.storage`; ``reroll sandbox prune`` removes it).
    None (the default): kept when `IsolatedSandbox.pool_snapshot` took a snapshot (a recording's
    checkpoint at every step, `reroll.rollout.extensions.checkpoints`), else deleted; False: never
    kept, and `pool_snapshot` takes none."""
    from_snapshot: str | None = None
    """``<pool folder>:<snapshot name>`` (`reroll.sandbox.local.storage.PoolSnapshot`): lay out on
    that kept pool, the workspace and HOME writable snapshots of that snapshot's, the task's seed
    not copied; None: a disk of its own."""
    agents_writable: bool = False
    """True only for `IsolatedSandbox.installer`: the agents folder is bound writable, and the
    sandbox's root is `INSTALLER_ID_BASE` (the installs' owner) instead of a range of its own
    (`reroll.sandbox.local.identity`)."""
    image_map: dict[str, str] = Field(default_factory=dict)
    """Source image → local replacement for the FROM lines of a task's Dockerfile, when the
    sandbox runs on the task's image (`reroll.sandbox.local.imagefs`; as docker's ``image_map``)."""
    image_builder: BuilderChoice = "auto"
    """What builds a task's image when the sandbox runs on it (`reroll.sandbox.local.imagefs`):
    ``auto``, Docker where its engine answers, else buildah (`reroll.sandbox.local.buildah`);
    ``docker`` or ``buildah``: that one only."""
    setup_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long the one-time setup on a task's image (agent user, folders) may take."""
