"""The settings of the `docker` backend (`DockerSandboxConfig`) and the image map's ``SRC=DST``
syntax: importable without the Docker SDK (the CLI checks ``--image-map`` before any backend loads)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from reroll_contracts.errors import ConfigError


class DockerSandboxConfig(BaseModel):
    """Settings of the `docker` backend: ``sandbox_config`` of a run (config.json), a job file or
    ``--sandbox-config``; ``--image-map`` sets `image_map`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ready_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long `start` waits for the container's sidecar to answer ready."""
    image: str | None = None
    """Run this image (a local tag) instead of the task's; its Dockerfile is then not built."""
    image_map: dict[str, str] = Field(default_factory=dict)
    """Source image → local replacement, applied to the FROM lines of a task's Dockerfile before
    it is built. Recorded in config.json, so ``continue``, ``replay``, ``branch`` and
    ``continue-job`` rebuild the same image."""
    setup_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long the one-time setup in a new container (agent user, folders) may take."""
    copy_on_write: bool = True
    """Where btrfs-progs is installed, make the sized file system btrfs with its folders as
    subvolumes, snapshotted copy-on-write (`reroll.sandbox.docker.cowdisk`); False: ext4 and the
    sidecar's tar snapshots (the benches compare the two)."""
    keep_snapshots: bool | None = None
    """With copy-on-write: `stop` keeps the disk, with only its snapshots, as a pool for
    ``from_snapshot`` (``reroll sandbox prune`` removes it). None (the default): kept when a pool
    snapshot was taken (a recording's checkpoint at every step); False: never, and none is taken."""
    from_snapshot: str | None = None
    """``<pool folder>:<snapshot name>`` (`reroll.sandbox.local.storage.PoolSnapshot`, a docker
    sandbox's pool): the sized folders writable snapshots of that snapshot's, its container layer
    copied in, the task's seed not uploaded; None: a disk of its own."""


def parse_image_map(pairs: list[str] | str) -> dict[str, str]:
    """``{source image: replacement}`` from ``SRC=DST`` items (a list, or one string separated by commas).

    Raises:
        ConfigError: an item is not ``SRC=DST`` with both sides non-empty.
    """
    items = pairs.split(",") if isinstance(pairs, str) else pairs
    mapping: dict[str, str] = {}
    for item in (item.strip() for item in items):
        if not item:
            continue
        source, equals, target = item.partition("=")
        if not (equals and source.strip() and target.strip()):
            raise ConfigError(
                f"image map item {item!r} must be SRC=DST, e.g. ubuntu:24.04=reroll/base:bookworm"
            )
        mapping[source.strip()] = target.strip()
    return mapping
