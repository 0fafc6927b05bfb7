"""Conformance checks of snapshot and restore."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile
from pathlib import Path

from reroll_contracts.errors import SandboxError

from reroll.conformance.support import expect, expect_raises, probe_task, sh, started
from reroll.sandbox.base import Sandbox, SandboxFactory


async def tree(sandbox: Sandbox, root: str, *, full: bool = False) -> dict[str, list[object]]:
    """The tree at `root` in the sandbox, read from a ``tar`` archive of it (GNU or busybox tar:
    the sandbox's image needs no Python), keyed by relative path.

    Returns:
        ``{path: [type, mode, content or link target]}``; with `full`, ``{path: [type, mode, uid,
        gid, mtime (s), link count (files), content or target]}`` plus ``".root": [mode, mtime]``
        and ``".links"``: the sorted groups of names sharing an inode.

    Raises:
        ConformanceError: tar failed.
    """
    result = await sandbox.exec(["tar", "-cf", "-", "-C", root, "."], cwd=root)
    expect(result.exit_code == 0, f"tar of {root} exited {result.exit_code}: {result.stderr.decode()[-500:]}")
    out: dict[str, list[object]] = {}
    bodies: dict[str, str] = {}
    groups: dict[str, list[str]] = {}  # first name of an inode → all its names
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        for member in archive.getmembers():
            name = os.path.normpath(member.name)
            if member.islnk():  # another name of an inode archived before
                first = os.path.normpath(member.linkname)
                groups.setdefault(first, [first]).append(name)
                kind, body = "file", bodies[first]
            elif member.issym():
                kind, body = "link", member.linkname
            elif member.isdir():
                kind, body = "dir", ""
            elif member.isfile():
                handle = archive.extractfile(member)
                kind, body = "file", handle.read().decode("latin-1") if handle else ""
                bodies[name] = body
            else:
                kind, body = "other", ""
            if name == ".":
                if full:
                    out[".root"] = [member.mode, int(member.mtime)]
                continue
            stamp = [member.uid, member.gid, int(member.mtime), 1] if full else []
            out[name] = [kind, member.mode, *stamp, body]
    if full:
        for names in groups.values():
            for name in names:
                out[name][5] = len(names)
        out[".links"] = [sorted(names) for names in sorted(groups.values(), key=sorted)]
    return out


HARD_CASES_BEFORE = r"""
mkdir -p d2f/sub gone/deeper f2d.parent && printf in > d2f/sub/x && printf f > f2d && printf g > gone/deeper/y
printf p > perm && chmod 640 perm && printf s > f2l && ln -s perm l2f && printf o > owned
printf h > hard && ln hard hard2 && head -c 300000 /dev/urandom > big && chmod 604 big
printf keep > same && printf sp > 'sp ace' && printf bs > 'back\slash' && printf d > ./-dash
mkdir -p "$(printf 'n%.0s' $(seq 60))/$(printf 'm%.0s' $(seq 60))" && printf deep > n*/m*/file
mkdir quiet && printf a > quiet/inplace
touch -d 2001-01-01 gone same d2f/sub quiet && chmod 750 gone/deeper
"""
"""Every kind of entry restore must get right, made in the workspace."""

HARD_CASES_CHANGES = r"""
rm -r d2f && printf now-a-file > d2f && rm f2d && mkdir f2d && printf z > f2d/z && rm -r gone
chmod 600 perm && rm f2l && ln -s perm f2l && rm l2f && printf real > l2f
if [ "$(id -u)" = 0 ]; then chown 65534:65534 owned; else chmod 604 owned; fi
printf b > quiet/inplace && printf H > hard && printf X | dd of=big bs=1 seek=1000 conv=notrunc 2>/dev/null
printf new > 'sp ace' && rm 'back\slash' ./-dash && rm -r n*/m* && ln -s / escape && mkfifo fifo
"""
"""Type changes both ways, a deleted folder, permission- and owner-only changes, files replaced by
symlinks and back, hard links edited in place, a file edited in place in an otherwise untouched
folder, a large file edited in place, odd and long names, a new fifo."""


async def restore_hard_cases(sandbox: Sandbox) -> None:
    """Snapshot a tree of HARD_CASES_BEFORE in the started `sandbox`, apply HARD_CASES_CHANGES,
    restore, compare; twice. The snapshot is named ``hard``.

    Raises:
        ConformanceError: a restore was not exact, or rewrote an unchanged file.
    """
    workspace = sandbox.layout.workspace
    await sh(sandbox, HARD_CASES_BEFORE)
    # Older than the snapshot's start (entries changed while it runs are always put back): this
    # way restore must tell changed entries from unchanged ones by their stamps.
    await asyncio.sleep(0.3)
    before = await tree(sandbox, workspace, full=True)
    expect(before[".links"] == [["hard", "hard2"]], f"hard links not made: {before['.links']}")
    same_inode = await sh(sandbox, "stat -c %i same")
    await sandbox.snapshot("hard")
    for round_trip in ("first", "second"):
        await sh(sandbox, HARD_CASES_CHANGES)
        expect(await tree(sandbox, workspace, full=True) != before, "the changes changed nothing")
        restored = await sandbox.restore("hard")
        expect(restored == [workspace], f"restore returned {restored}, not [{workspace!r}]")
        after = await tree(sandbox, workspace, full=True)
        differing = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
        expect(not differing, f"{round_trip} restore differs at {differing}")
    expect(await sh(sandbox, "stat -c %i same") == same_inode, "restore rewrote an unchanged file")


async def check_restore_puts_back_contents_modes_symlinks_and_deletions(
    factory: SandboxFactory, workdir: Path
) -> None:
    """snapshot of the workspace, then restore: contents, modes, symlinks, deletions, same-size edits."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        workspace = sandbox.layout.workspace
        await sh(
            sandbox,
            "mkdir -p pkg/deep && printf 'one' > pkg/a.txt && printf 'two' > pkg/deep/b.txt && "
            "printf 'x' > run.sh && chmod 755 run.sh && chmod 700 pkg/deep && ln -s pkg/a.txt link && "
            "printf 'gone later' > doomed.txt && printf 'abc' > same.txt && touch -d 2001-01-01 same.txt",
        )
        before = await tree(sandbox, workspace)
        size = await sandbox.snapshot("before")
        expect(size > 0, f"snapshot reported {size} bytes")
        await sh(
            sandbox,
            "printf 'changed' > pkg/a.txt && chmod 600 run.sh && rm doomed.txt && rm -r pkg/deep && "
            "rm link && ln -s run.sh link && printf 'new' > added.txt && mkdir newdir && "
            "printf 'xyz' > same.txt && touch -d 2001-01-01 same.txt",  # same size and mtime, new content
        )
        restored = await sandbox.restore("before")
        expect(restored == [workspace], f"restore returned {restored}, not [{workspace!r}]")
        after = await tree(sandbox, workspace)
        differing = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
        expect(not differing, f"restore differs at {differing}")


async def check_restore_gets_types_owners_permissions_links_and_names_right(
    factory: SandboxFactory, workdir: Path
) -> None:
    """restore, twice, after every kind of change (see `restore_hard_cases`)."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        await restore_hard_cases(sandbox)


async def check_snapshot_of_named_paths_records_absent_ones(factory: SandboxFactory, workdir: Path) -> None:
    """snapshot of named paths: only those are restored, and one absent at snapshot time is deleted."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        workspace = sandbox.layout.workspace
        keep, absent = f"{workspace}/keep.txt", f"{workspace}/absent.txt"
        await sh(sandbox, "printf 'kept' > keep.txt && printf 'other' > other.txt")
        await sandbox.snapshot("named", [keep, absent])
        await sh(
            sandbox, "printf 'changed' > keep.txt && printf 'created' > absent.txt && printf 'x' > other.txt"
        )
        restored = await sandbox.restore("named")
        expect(restored == [keep, absent], f"restore returned {restored}")
        expect(await sandbox.get_file(keep) == b"kept", "a named file was not restored")
        with expect_raises(FileNotFoundError, "absent"):
            await sandbox.get_file(absent)
        expect(
            await sandbox.get_file(f"{workspace}/other.txt") == b"x", "a file outside the snapshot changed"
        )
        await sandbox.snapshot("nothing-yet", [absent])
        await sh(sandbox, "printf 'created' > absent.txt")
        await sandbox.restore("nothing-yet")
        with expect_raises(FileNotFoundError, "absent"):
            await sandbox.get_file(absent)


async def check_restore_of_an_unknown_snapshot_or_bad_name_fails_clearly(
    factory: SandboxFactory, workdir: Path
) -> None:
    """restore of an unknown name, snapshot of a name with a path in it: SandboxError saying so."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        with expect_raises(SandboxError, "no snapshot named 'never'"):
            await sandbox.restore("never")
        with expect_raises(SandboxError, "snapshot name"):
            await sandbox.snapshot("../escape")


async def check_manifest_hashes_files_and_follows_no_link(factory: SandboxFactory, workdir: Path) -> None:
    """manifest: sha256 of regular files; links, FIFOs and bytecode caches recorded, never opened."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        root = f"{sandbox.layout.workspace}/tree"
        await sh(
            sandbox,
            "mkdir -p tree/src/__pycache__ && cd tree && printf 'print(1)\\n' > src/a.py"
            " && printf x > src/__pycache__/a.pyc"
            " && ln -s /etc etc-link && ln -s src/a.py file-link && mkfifo pipe && printf '' > empty",
        )
        manifest = await sandbox.manifest(root)
        expected = {
            "empty": hashlib.sha256(b"").hexdigest(),
            "etc-link": "symlink:/etc",
            "file-link": "symlink:src/a.py",
            "pipe": "fifo:",
            "src/a.py": hashlib.sha256(b"print(1)\n").hexdigest(),
        }
        expect(manifest == expected, f"manifest of the workspace: {manifest}, expected {expected}")
        expect(list(manifest) == sorted(manifest), f"manifest not sorted by path: {list(manifest)}")
        with expect_raises(SandboxError, "not a folder"):
            await sandbox.manifest(f"{root}/etc-link")
