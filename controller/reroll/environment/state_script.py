"""Run inside a sandbox as root (``python3 state_script.py`` with a JSON request on stdin): the
root side of `reroll.environment.state`. Standard library only (the sandbox's ``python3``), no reroll
import: its text is sent into the sandbox and run there.

Requests (one JSON object on stdin), each answered by one JSON object on stdout::

    {"op": "pack", "kind": "sqlite"|"files", "paths": [...], "out": FILE}
        → {"digest": HEX, "size": BYTES}      the state as one tar file at `out`
    {"op": "unpack", "kind": ..., "paths": [...], "tar": FILE}
        → {"digest": HEX}                     the state put back from `tar`
    {"op": "digest", "kind": ..., "paths": [...]}
        → {"digest": HEX}                     a digest of the state as it is

The digest is of the content, not of the bytes a file happens to have: for ``sqlite`` the pages
of a backup copy (so a database restored through the backup API digests as its original,
whatever its journal held), for ``files`` every entry's relative path, type, mode and content
(a symlink's target, never what it points at). A path absent at ``pack`` is recorded as
absent, and ``unpack`` deletes it; a path's missing parent folder is made with the owner and
mode the snapshot's had; a folder that exists is refilled in place (it may be a mount point).

Never follows the agent's links: every component of every state path is checked with ``lstat``
first and a symbolic link refuses the request (exit 3, the reason on stderr). The callers run it
only while no process of the agent lives (quiesced before a snapshot, not yet started before a
restore), so nothing can swap a component between the check and the use.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import stat
import sys
import tarfile
import tempfile
from typing import Any


class Refused(Exception):
    """A request this script will not carry out (a planted link, a missing database)."""


def check_no_links(path: str) -> bool:
    """Refuse `path` when any component of it (the last one too) is a symbolic link."""
    if not os.path.isabs(path):
        raise Refused(f"state path {path!r} is not absolute")
    current = "/"
    for part in [part for part in path.split("/") if part]:
        if part in (".", ".."):
            raise Refused(f"state path {path!r} has a '.' or '..' component")
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(info.st_mode):
            raise Refused(f"state path {path!r}: {current} is a symbolic link; reroll does not follow it")
    return True


def digest_sqlite(path: str, hasher: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="reroll-digest-") as scratch:
        copy = os.path.join(scratch, "copy.db")
        backup(f"file:{path}?mode=ro", copy)
        hash_database_copy(copy, hasher)


def backup(source_uri: str, target: str) -> None:
    """Copy the database at `source_uri` into `target` through SQLite's online backup API."""
    source = sqlite3.connect(source_uri, uri=True)
    destination = sqlite3.connect(target)
    try:
        source.backup(destination)
    finally:
        destination.close()
        source.close()


def hash_database_copy(copy: str, hasher: Any) -> None:
    """Hash a backup copy's pages, leaving out the header fields a copy changes by itself (the
    file change counter, bytes 24-27; the version-valid-for number and SQLite's version, 92-99:
    https://www.sqlite.org/fileformat.html#the_database_header)."""
    with open(copy, "rb") as handle:
        header = bytearray(handle.read(100))
        header[24:28] = bytes(4)
        header[92:100] = bytes(8)
        hasher.update(bytes(header))
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(chunk)


def digest_tree(path: str, hasher: Any) -> None:
    info = os.lstat(path)
    entries = [("", info)]
    if stat.S_ISDIR(info.st_mode):
        for folder, dirs, files in os.walk(path):  # os.walk does not follow links by default
            dirs.sort()
            for name in sorted(dirs + files):
                full = os.path.join(folder, name)
                entries.append((os.path.relpath(full, path), os.lstat(full)))
        entries.sort(key=lambda entry: entry[0])
    for relative, entry in entries:
        mode = stat.S_IMODE(entry.st_mode)
        full = os.path.join(path, relative) if relative else path
        if stat.S_ISLNK(entry.st_mode):
            content = "link:" + os.readlink(full)
        elif stat.S_ISREG(entry.st_mode):
            file_hash = hashlib.sha256()
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    file_hash.update(chunk)
            content = "file:" + file_hash.hexdigest()
        elif stat.S_ISDIR(entry.st_mode):
            content = "dir"
        else:
            content = "special"
        hasher.update(f"{relative}\0{mode:o}\0{content}\n".encode())


def digest(kind: str, paths: list[str], copies: dict[int, str] | None = None) -> str:
    """The content digest of `paths`; `copies`: backup copies of the databases just made (by
    position), hashed instead of copying them again."""
    hasher = hashlib.sha256()
    for index, path in enumerate(paths):
        present = check_no_links(path)
        hasher.update(f"#{index} {path} {'present' if present else 'absent'}\n".encode())
        if not present:
            continue
        if kind == "sqlite" and copies is not None and index in copies:
            hash_database_copy(copies[index], hasher)
        elif kind == "sqlite":
            digest_sqlite(path, hasher)
        else:
            digest_tree(path, hasher)
    return hasher.hexdigest()


def pack(kind: str, paths: list[str], out: str) -> dict[str, Any]:
    present = []
    parents = {}
    copies: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="reroll-state-") as scratch, tarfile.open(out, "w") as tar:
        for index, path in enumerate(paths):
            if not check_no_links(path):
                continue  # recorded as absent: a restore deletes it
            present.append(index)
            info = os.lstat(os.path.dirname(path))
            parents[index] = [info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)]
            if kind == "sqlite":
                copy = os.path.join(scratch, f"{index}.db")
                backup(f"file:{path}?mode=ro", copy)  # a consistent copy, writers or not
                copies[index] = copy
                info = os.lstat(path)
                member = tar.gettarinfo(copy, arcname=str(index))
                member.uid, member.gid, member.mode = info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)
                with open(copy, "rb") as handle:
                    tar.addfile(member, handle)
            else:
                tar.add(path, arcname=str(index), recursive=True)  # links stored as links
        index_file = json.dumps({"paths": paths, "present": present, "parents": parents}).encode()
        member = tarfile.TarInfo("state.json")
        member.size = len(index_file)
        tar.addfile(member, io.BytesIO(index_file))
        content = digest(kind, paths, copies)
    os.chmod(out, 0o600)
    return {"digest": content, "size": os.path.getsize(out)}


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Refuse a member outside the staging folder, or under a member that is a link (a tar
    reroll wrote never has one; the check does not depend on tarfile's filters, which the
    sandbox's python3 may lack)."""
    links = {member.name for member in members if member.issym() or member.islnk()}
    for member in members:
        parts = member.name.split("/")
        if member.name.startswith("/") or ".." in parts:
            raise Refused(f"snapshot member {member.name!r} points outside its folder")
        if any("/".join(parts[:end]) in links for end in range(1, len(parts))):
            raise Refused(f"snapshot member {member.name!r} lies under a link")
        if member.islnk() and (member.linkname.startswith("/") or ".." in member.linkname.split("/")):
            raise Refused(f"snapshot hard link {member.name!r} points outside its folder")


def remove(path: str) -> None:
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: never follows a link inside
    else:
        os.unlink(path)


def unpack(kind: str, paths: list[str], tar_path: str) -> dict[str, Any]:
    with tarfile.open(tar_path) as tar:
        index = json.load(tar.extractfile("state.json") or io.BytesIO(b"{}"))
        if index["paths"] != paths:
            raise Refused(f"the snapshot holds the state paths {index['paths']}, the task declares {paths}")
        for position, path in enumerate(paths):
            exists = check_no_links(path)
            parent = os.path.dirname(path)
            check_no_links(parent)
            if position not in index["present"]:
                if exists:
                    remove(path)
                continue
            if not os.path.lexists(parent):  # a fresh sandbox: made as the snapshot's was
                os.makedirs(parent)
                uid, gid, mode = index.get("parents", {}).get(str(position), [0, 0, 0o755])
                os.chown(parent, uid, gid)
                os.chmod(parent, mode)
            members = [
                member
                for member in tar.getmembers()
                if member.name == str(position) or member.name.startswith(f"{position}/")
            ]
            check_members(members)
            folder = exists and stat.S_ISDIR(os.lstat(path).st_mode) and members[0].isdir()
            # a folder is refilled in place (it may be a mount point: the workspace, HOME)
            staging = tempfile.mkdtemp(prefix=".reroll-restore-", dir=path if folder else parent)
            try:
                tar.extractall(staging, members=members, numeric_owner=True)
                staged = os.path.join(staging, str(position))
                if kind == "sqlite" and exists:
                    backup(f"file:{staged}", path)  # in place, through the backup API
                elif folder:
                    refill(path, staged, os.path.basename(staging))
                else:
                    if exists:
                        remove(path)
                    os.rename(staged, path)
            finally:
                shutil.rmtree(staging)
    return {"digest": digest(kind, paths)}


def refill(path: str, staged: str, staging_name: str) -> None:
    """Make folder `path` hold exactly what folder `staged` (inside it, in `staging_name`) holds,
    with its owner and mode, keeping `path` itself."""
    for name in os.listdir(path):
        if name != staging_name:
            remove(os.path.join(path, name))
    for name in os.listdir(staged):
        os.rename(os.path.join(staged, name), os.path.join(path, name))
    info = os.lstat(staged)
    os.chown(path, info.st_uid, info.st_gid)
    os.chmod(path, stat.S_IMODE(info.st_mode))


def main() -> None:
    request = json.load(sys.stdin)
    kind, paths = request["kind"], request["paths"]
    try:
        if request["op"] == "pack":
            answer = pack(kind, paths, request["out"])
        elif request["op"] == "unpack":
            answer = unpack(kind, paths, request["tar"])
        else:
            answer = {"digest": digest(kind, paths)}
    except (Refused, sqlite3.Error, OSError, tarfile.TarError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(3)
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
