"""The conventions a rollout's container follows (the spec's, `reroll.sandbox.spec.SandboxSpec`): the
image's WORKDIR, USER and ENV as every phase's defaults (`image_defaults`), the setup script
that makes the agent's user and folders in a new container (`SETUP_SCRIPT`), and the names Docker
allows (`docker_name`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from reroll_contracts.errors import SandboxError
from reroll_contracts.sandbox_paths import DEFAULT_WORKDIR

AGENT_USER = "agent"
"""The agent's user of a native task (unprivileged, created when the image lacks it)."""
AGENTS_DIR = "/opt/reroll-agents"
"""Where the shared installs are mounted in every container."""

# Runs once in every new container, as root, with $1 the agent's user (a name or a uid) and $2
# its working folder: the user, folders and ownership; prints the user's name and HOME. POSIX sh
# with useradd (Debian), adduser (Alpine, busybox) or neither (a bare busybox image: the passwd
# and group entries are written, uid and gid the first free from 1000; root's too when missing).
# A uid without a passwd entry becomes user `agent` with that uid.
SETUP_SCRIPT = f"""
set -e
user=$1 workdir=$2
grep -q "^root:" /etc/passwd 2>/dev/null || echo "root:x:0:0:root:/root:/bin/sh" >>/etc/passwd
grep -q "^root:" /etc/group 2>/dev/null || echo "root:x:0:" >>/etc/group
uid=
case $user in *[!0-9]*) ;; *) uid=$user
  user=$(awk -F: -v u="$uid" '$3 == u {{ print $1; exit }}' /etc/passwd)
  [ -n "$user" ] || user={AGENT_USER} ;;
esac
if ! grep -q "^$user:" /etc/passwd; then
  if command -v useradd >/dev/null 2>&1; then
    useradd --create-home --shell /bin/sh ${{uid:+--uid "$uid"}} "$user"
  elif command -v adduser >/dev/null 2>&1; then adduser -D -s /bin/sh ${{uid:+-u "$uid"}} "$user"
  else
    n=${{uid:-1000}}
    while [ -z "$uid" ] && cut -d: -f3 /etc/passwd /etc/group 2>/dev/null | grep -qx "$n"; do
      n=$((n + 1))
    done
    echo "$user:x:$n:$n::/home/$user:/bin/sh" >>/etc/passwd
    echo "$user:x:$n:" >>/etc/group
    mkdir -p "/home/$user"
  fi
fi
home=$(grep "^$user:" /etc/passwd | cut -d: -f6)
mkdir -p "$workdir" /logs/agent /logs/verifier {AGENTS_DIR} "$home"
if [ "$(grep "^$user:" /etc/passwd | cut -d: -f3)" != 0 ]; then
  chown -R "$user:$(grep "^$user:" /etc/passwd | cut -d: -f4)" "$workdir" /logs/agent "$home"
fi
echo "$user"
echo "$home"
"""


@dataclass(frozen=True)
class ImageDefaults:
    """What an image says about its processes (``docker inspect``'s ``Config``)."""

    workdir: str
    """Its WORKDIR, `DEFAULT_WORKDIR` when unset or ``/``."""
    user: str
    """Its USER without the group (a name or a uid), ``root`` when unset."""
    env: dict[str, str]
    """Its ENV (``KEY=value`` entries, PATH included), every phase's base environment."""


def image_defaults(client: docker.DockerClient, image: str) -> ImageDefaults:
    """The WORKDIR, USER and ENV of the local `image` (Harbor's defaults for every phase).

    Raises:
        SandboxError: no such local image.
    """
    try:
        config = client.images.get(image).attrs.get("Config") or {}
    except docker.errors.ImageNotFound as exc:
        raise SandboxError(f"image {image} is not a local image") from exc
    return defaults_of(config)


def defaults_of(config: Mapping[str, Any]) -> ImageDefaults:
    """The `ImageDefaults` of an image's configuration (``WorkingDir``, ``User``, ``Env``: Docker's
    ``Config`` and the OCI image config name them alike)."""
    workdir = (config.get("WorkingDir") or "").rstrip("/")
    user = (config.get("User") or "").partition(":")[0]
    env = dict(entry.partition("=")[::2] for entry in config.get("Env") or [] if "=" in entry)
    return ImageDefaults(workdir=workdir or DEFAULT_WORKDIR, user=user or "root", env=env)


def docker_name(run_id: str) -> str:
    """`run_id` as Docker names allow it (containers, volumes: ``[a-zA-Z0-9_.-]``): every other
    run of characters becomes ``-``. A task named ``Parallel TF-IDF Similarity Search`` (SkillsBench's
    ``[task] name``) gives run folders, hence run ids, with spaces."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id)
