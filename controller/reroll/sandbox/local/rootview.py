"""The isolated local sandbox's user namespace and root view, built by Debian's bubblewrap.

Identity: the sandbox runs in a user namespace whose ids ``0..ID_COUNT-1`` map to the host's
``id_base..id_base+ID_COUNT-1`` (a range of its own for each rollout,
`reroll.sandbox.local.identity.IdSlot`; `INSTALLER_ID_BASE` for the short-lived installer of shared
installs), so its root — the sidecar, the verifier, a task's root
agent — is an unprivileged host user with capabilities only over the sandbox's own namespaces,
and only Docker's default set of them (`CAPABILITIES`: no ``CAP_SYS_ADMIN``, so no mount or
unmount; no ``CAP_SYS_PTRACE``). The host's root is not mapped: a host-root file is ``nobody`` to
the sandbox, and its root's ``CAP_DAC_OVERRIDE`` does not apply to it.

Why bubblewrap and what it cannot do alone: ``bwrap`` maps a single id when it makes a user
namespace unprivileged, and the sandbox needs a range (root and the agent's user). So ``bwrap`` is
started as the host user ``id_base`` with ``--userns-block-fd`` and ``--info-fd``: it makes the
namespaces, reports its child's pid and waits; the controller (host root, ``CAP_SETUID`` in the
parent namespace) writes the range into the child's ``uid_map``/``gid_map`` (`write_id_maps`), then
lets it go on. Everything ``bwrap`` then creates belongs to the sandbox's root.

``bwrap`` runs as ``id_base``, which cannot traverse root-only host folders (``/root`` is 0700):
the pieces that live there (reroll's cache: the agents folder, the sidecar bundle) are *staged*
first — a util-linux ``unshare --mount`` of host root binds each (read-only unless asked) onto an
empty folder of the sandbox's own, in a mount namespace that only this sandbox inherits — and
``bwrap`` binds the staged folder. Mounts copied into a less privileged mount namespace are
locked by the kernel, so the sandbox cannot turn such a read-only bind writable.

The root view (`RootView`): as ``/``, the host folder `RootView.root_source` bound writable
(staged: the top of the sandbox's sized file system) or else a tmpfs of `RootView.storage_bytes`
(everything the sandbox writes outside its bound folders lands there, ``/tmp`` included), the
system's ``/usr`` read-only with ``/bin``, ``/sbin`` and ``/lib*`` as on the host (links or
read-only binds), a minimal ``/etc``
(`SHARED_ETC` read-only from the host, plus generated ``passwd``, ``group``, ``hosts``,
``hostname`` and ``resolv.conf`` with the sandbox's users), a fresh ``/proc`` (``/proc/sys``
read-only), a minimal ``/dev``, and the `Piece` s the sandbox names (workspace, logs, verifier,
HOME, the control folder, the agents folder, the sidecar bundle). Nothing else of the host.
With `RootView.lower` (a task's image, `reroll.sandbox.local.imagefs`), ``/`` is instead an
overlay of the image's files under the writable folder, mounted by host root while staging, and
the image's own system and ``/etc`` replace the host's.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from reroll_contracts.sandbox_paths import DEFAULT_WORKDIR

from reroll.cache import cache_dir
from reroll.sandbox.sidecar_bundle import MOUNT_DIR

IMAGE_ID_BASE = 100000
"""The host uid/gid owning what root owned in a task's unpacked image (`reroll.sandbox.local.imagefs`),
shared by every rollout and shown to each as its own range through an idmapped mount
(`reroll.sandbox.local.identity`); never a running sandbox's."""
INSTALLER_ID_BASE = IMAGE_ID_BASE + 65536
"""The host uid/gid of the installer's root: the owner of the shared installs, which rollouts'
roots therefore cannot write even through a writable mount."""
ID_COUNT = 65536
"""How many ids the sandbox has (``0..65535``)."""
AGENT_ID = 1000
"""The agent's uid and gid inside the sandbox."""
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
"""The sandbox root's capabilities, over its own namespaces only: Docker's default set."""
SYSTEM_DIRS = ("/usr",)
"""Host folders bound read-only at their own path."""
TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Host entries reproduced as they are: a link (merged /usr) as the same link, a folder read-only."""
SHARED_ETC = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "gai.conf",
    "host.conf",
    "inputrc",
    "issue",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "login.defs",
    "magic",
    "magic.mime",
    "mime.types",
    "networks",
    "nsswitch.conf",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "python3.11",
    "python3.12",
    "services",
    "shells",
    "ssl",
    "timezone",
    "bash.bashrc",
)
"""Entries of the host's ``/etc`` bound read-only where present: what the loader, the shells,
Python and TLS read. Nothing with credentials (no ``shadow``, ``gitconfig``, ``pip.conf``, ``npmrc``)."""
DNS_FORWARD = "169.254.0.53"
"""The nameserver of a sandbox whose host resolves through a loopback resolver: pasta
(``--dns-forward``) sends what reaches it to the host's resolver."""
STAGE = ".stage"
"""The sandbox folder's sub-folder holding the staging mount points (see the module docstring)."""


@dataclass(frozen=True)
class Piece:
    """A host path bound into the sandbox."""

    source: str
    """Absolute host path."""
    target: str
    """Absolute path inside the sandbox."""
    writable: bool = False
    staged: bool = False
    """Bind it through the staging namespace: its host path is not reachable by the sandbox's
    host user (below a root-only folder)."""


@dataclass
class RootView:
    """What the sandbox sees and who it is; `command` turns it into the process to start."""

    folder: Path
    """The sandbox's host folder (owned by `id_base`; `STAGE` and ``etc/`` are made in it)."""
    hostname: str
    storage_bytes: int
    """Size of the tmpfs ``/``: the most the sandbox writes outside its bound folders, bytes
    (unused when `root_source` is set)."""
    root_source: str = ""
    """A host folder (staged: it may be root-only) bound writable as ``/`` instead of a tmpfs:
    the top of a sized file system (`reroll.sandbox.docker.disk`); "": a tmpfs of `storage_bytes`."""
    lower: str = ""
    """An image's unpacked root file system (`reroll.sandbox.local.imagefs`; staged: an idmapped
    copy's ``/proc/<pid>/fd/<fd>``, `reroll.sandbox.local.identity.idmapped_tree`) as the
    read-only lower layer of ``/``, an overlay whose ``upper/`` and ``work/`` are in `root_source`;
    the host's system and ``/etc`` are then not shown (the image's are), but for the generated
    ``hostname``, ``hosts`` and ``resolv.conf``. "": `root_source` itself is ``/``."""
    shm_bytes: int = 0
    """Size of ``/dev/shm`` (a tmpfs of its own), bytes; 0: the ``/dev`` tmpfs's folder."""
    id_base: int = field(kw_only=True)
    """The host uid/gid of the sandbox's root (see the module docstring)."""
    pieces: list[Piece] = field(default_factory=list)
    folders: list[tuple[str, int]] = field(default_factory=list)
    """Folders made on the tmpfs (path inside, mode), before the pieces are bound."""

    def write_etc(self, agent_user: str) -> Path:
        """Write the generated ``/etc`` files into ``<folder>/etc`` (root, the agent, nobody).

        Returns:
            The folder written.
        """
        etc = self.folder / "etc"
        etc.mkdir(exist_ok=True)
        users = [("root", 0, "/root", "/bin/sh"), (agent_user, AGENT_ID, f"/home/{agent_user}", "/bin/sh")]
        users.append(("nobody", 65534, "/nonexistent", "/usr/sbin/nologin"))
        (etc / "passwd").write_text("".join(f"{n}:x:{i}:{i}:{n}:{h}:{s}\n" for n, i, h, s in users))
        groups = [("root", 0), ("tty", 5), (agent_user, AGENT_ID), ("nogroup", 65534)]
        (etc / "group").write_text("".join(f"{name}:x:{gid}:\n" for name, gid in groups))
        (etc / "hostname").write_text(f"{self.hostname}\n")
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{self.hostname}\n")
        try:
            resolv = Path("/etc/resolv.conf").read_text()
        except OSError:
            resolv = ""
        (etc / "resolv.conf").write_text(sandbox_resolv_conf(resolv))
        for path in etc.iterdir():
            path.chmod(0o644)
        return etc

    def command(self, argv: list[str], info_fd: int, block_fd: int) -> list[str]:
        """The host command that starts `argv` as the sandbox's root inside this view.

        Args:
            argv: the program inside the sandbox and its arguments.
            info_fd: the write end of a pipe on which ``bwrap`` reports its child's pid.
            block_fd: the read end of a pipe ``bwrap`` waits on until the id maps are written.

        Every sandbox gets a network namespace of its own (only ``lo``): network ``full``
        attaches outbound access to it afterwards (`reroll.sandbox.local.isolated`).

        Raises:
            FileNotFoundError: ``bwrap``, ``setpriv`` or ``unshare`` is not installed.
        """
        tools = {name: shutil.which(name) for name in ("bwrap", "setpriv", "unshare")}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise FileNotFoundError(f"the isolated local sandbox needs {', '.join(missing)} on PATH")
        bwrap = [
            str(tools["bwrap"]),
            *("--unshare-user", "--uid", "0", "--gid", "0"),
            *("--info-fd", str(info_fd), "--userns-block-fd", str(block_fd)),
            *("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"),
            *("--hostname", self.hostname, "--die-with-parent", "--new-session"),
        ]
        stage_script = []
        if self.root_source:
            point = self._stage_point("root")
            stage_script.append(self._root_mount(point))
            bwrap += ["--bind", str(point), "/"]
        else:
            bwrap += ["--size", str(self.storage_bytes), "--perms", "0755", "--tmpfs", "/"]
        if not self.lower:
            bwrap += system_args()
        bwrap += ["--proc", "/proc", "--dev", "/dev", "--perms", "0755", "--dir", "/etc"]
        if self.shm_bytes:
            bwrap += ["--size", str(self.shm_bytes), "--perms", "1777", "--tmpfs", "/dev/shm"]
        for name in () if self.lower else SHARED_ETC:
            if os.path.lexists(f"/etc/{name}"):
                bwrap += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for name in ("hostname", "hosts", "resolv.conf", *(() if self.lower else ("passwd", "group"))):
            bwrap += ["--ro-bind", str(self.folder / "etc" / name), f"/etc/{name}"]
        made = {"/", "/etc"}
        for path, mode in [("/tmp", 0o1777), ("/var/tmp", 0o1777), ("/run", 0o755), *self.folders]:
            made |= {str(parent) for parent in Path(path).parents} | {path}
            bwrap += ["--perms", f"{mode:04o}", "--dir", path]
        for piece in self.pieces:  # bwrap would make their missing parents 0700: the agent could not pass
            for parent in reversed(Path(piece.target).parents):
                if str(parent) not in made:
                    made.add(str(parent))
                    bwrap += ["--perms", "0755", "--dir", str(parent)]
        for index, piece in enumerate(self.pieces):
            source = piece.source
            if piece.staged:
                point = self._stage_point(str(index))
                options = "" if piece.writable else " -o ro"
                stage_script.append(f"mount --bind{options} {shlex.quote(source)} {shlex.quote(str(point))}")
                source = str(point)
            bwrap += ["--bind" if piece.writable else "--ro-bind", source, piece.target]
        for cap in CAPABILITIES:
            bwrap += ["--cap-add", cap]
        bwrap += ["--chdir", "/", "--", *argv]
        user = [str(tools["setpriv"]), f"--reuid={self.id_base}", f"--regid={self.id_base}", "--clear-groups"]
        command = [*user, "--", *bwrap]
        if stage_script:
            script = " && ".join([*stage_script, 'exec "$@"'])
            stage = [str(tools["unshare"]), "--mount", "--propagation", "private", "--", "sh", "-c", script]
            command = [*stage, "sh", *command]
        return command

    def _root_mount(self, point: Path) -> str:
        """The staging namespace's command mounting ``/`` on `point`: `root_source` bound, or with
        `lower`, the overlay of `lower` and `root_source`'s ``upper/`` (host root mounts it, as
        Docker's overlay2: copy-ups keep each file's owner)."""
        if not self.lower:
            return f"mount --bind {shlex.quote(self.root_source)} {shlex.quote(str(point))}"
        layers = f"lowerdir={self.lower},upperdir={self.root_source}/upper,workdir={self.root_source}/work"
        return f"mount -t overlay overlay -o {shlex.quote(layers)} {shlex.quote(str(point))}"

    def _stage_point(self, name: str) -> Path:
        """An empty folder of the sandbox's (``<folder>/.stage/<name>``) to stage a mount on."""
        point = self.folder / STAGE / name
        point.mkdir(parents=True, exist_ok=True)
        os.chown(point, self.id_base, self.id_base)
        return point


def sandbox_resolv_conf(host: str) -> str:
    """The sandbox's ``resolv.conf`` from the host's text: the same, unless every nameserver is
    a loopback address (systemd-resolved's ``127.0.0.53``), unreachable from the sandbox's own
    network namespace; then `DNS_FORWARD`, which pasta forwards to the host's resolver."""
    lines = host.splitlines()
    servers = [
        line.split()[1] for line in lines if line.split()[:1] == ["nameserver"] and len(line.split()) > 1
    ]
    if servers and all(server.startswith("127.") or server == "::1" for server in servers):
        kept = [line for line in lines if line.split()[:1] != ["nameserver"]]
        return "\n".join([f"nameserver {DNS_FORWARD}", *kept]) + "\n"
    return host


def system_args() -> list[str]:
    """``bwrap`` arguments that show the host's programs and libraries read-only: `SYSTEM_DIRS`
    bound, `TOP_LEVEL` entries as on the host (the same link, or a read-only bind)."""
    args = []
    for path in SYSTEM_DIRS:
        args += ["--ro-bind", path, path]
    for path in TOP_LEVEL:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def read_child_pid(info_fd: int) -> int:
    """The pid (host's) of ``bwrap``'s child, from the JSON ``bwrap`` writes on `info_fd` (read to
    its end and closed).

    Raises:
        OSError: ``bwrap`` exited before reporting it (its error is in its log).
    """
    data = b""
    with os.fdopen(info_fd, "rb") as info:
        data = info.read()
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise OSError(f"bwrap reported no child pid (it exited: {data[:200]!r})") from exc


def write_id_maps(pid: int, id_base: int) -> None:
    """Map the sandbox's ids ``0..ID_COUNT-1`` to the host's ``id_base..`` in process `pid`'s
    user namespace (``/proc/PID/uid_map`` and ``gid_map``; needs ``CAP_SETUID``/``CAP_SETGID``).

    Raises:
        OSError: the maps could not be written (the process is gone, or lacks the right).
    """
    line = f"0 {id_base} {ID_COUNT}\n"
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as out:
            out.write(line)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give `path` and everything below it (links not followed) to `uid`:`gid` on the host."""
    os.lchown(path, uid, gid)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(folder, name), uid, gid)


def workspace_folder(workdir: str | None) -> str:
    """A sandbox's working folder: `workdir` (a spec's, None: `DEFAULT_WORKDIR`), unless a folder bound
    there would hide the agents folder or land in a read-only system folder (``/usr/src/app``);
    then `DEFAULT_WORKDIR`. Task scripts that read ``$REROLL_WORKSPACE`` run either way."""
    wanted = Path(workdir or DEFAULT_WORKDIR)
    agents = cache_dir() / "agents"
    system = [Path(path) for path in (*SYSTEM_DIRS, *TOP_LEVEL, "/etc", "/proc", "/dev", MOUNT_DIR)]
    if wanted == Path("/") or wanted == agents or wanted in agents.parents:
        return DEFAULT_WORKDIR
    if any(wanted == path or path in wanted.parents for path in system):
        return DEFAULT_WORKDIR
    return str(wanted)


PROBE_TIMEOUT_SECONDS = 10.0
"""How long `namespaces_unavailable`'s tiny sandbox may take."""


@functools.cache
def namespaces_unavailable() -> str:
    """Why this machine cannot run an isolated sandbox (empty when it can): runs a tiny one, in
    the namespaces and with the system folders of every root view."""
    if os.geteuid() != 0:
        return "the isolated local sandbox needs root (it maps the sandbox's ids to a host range)"
    missing = [name for name in ("bwrap", "setpriv", "unshare") if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/install-sandbox-tools)"
    probe = [
        "setpriv",
        f"--reuid={INSTALLER_ID_BASE}",
        f"--regid={INSTALLER_ID_BASE}",
        "--clear-groups",
        "--",
        "bwrap",
        *("--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid", "--unshare-net"),
        *("--unshare-ipc", "--unshare-uts", "--tmpfs", "/", *system_args()),
        *("--proc", "/proc", "--dev", "/dev", "--", "true"),
    ]
    try:
        done = subprocess.run(
            probe, capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")
