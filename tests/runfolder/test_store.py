"""The learner store's format: content-addressed generations, diffs, rollback, and corrupt files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from reroll.runfolder.store import (
    check_store_path,
    commit_generation,
    create_store,
    diff_files,
    list_generations,
    load_generation,
    load_head,
    put_blob,
    read_blob,
    rollback_store,
    unified_diff,
)
from reroll_contracts.errors import StoreError


def commit(store: Path, parent: int, files: dict[str, bytes], rollout: str) -> int:
    hashes = {path: put_blob(store, data) for path, data in files.items()}
    generation = commit_generation(
        store, parent=parent, files=hashes, rollout=rollout, status="ok", rewards={"reward": 1.0}
    )
    return generation.number


def test_blobs_are_content_addressed_and_deduplicated(tmp_path: Path) -> None:
    store = tmp_path / "store"
    create_store(store)
    a, again = put_blob(store, b"same"), put_blob(store, b"same")
    assert a == again and len(list((store / "objects").rglob("*"))) == 2  # one folder, one blob
    assert read_blob(store, a) == b"same"
    (store / "objects" / a[:2] / a).write_bytes(b"tampered")
    with pytest.raises(StoreError, match=rf"objects/{a[:2]}/{a}: corrupt"):
        read_blob(store, a)


def test_generations_chain_and_rollback_is_recorded(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    (seed / "skills" / "base").mkdir(parents=True)
    (seed / "skills" / "base" / "SKILL.md").write_text("base\n")
    store = tmp_path / "store"
    assert create_store(store, seed).generation == 0
    assert load_generation(store, 0).files.keys() == {"skills/base/SKILL.md"}
    one = commit(store, 0, {"skills/base/SKILL.md": b"base\n", "memory/m.md": b"1\n"}, "r1")
    two = commit(store, one, {"skills/base/SKILL.md": b"base v2\n", "memory/m.md": b"1\n"}, "r2")
    assert (one, two, load_head(store).generation) == (1, 2, 2)
    assert create_store(store, seed).generation == 2  # an existing store is kept (resume)
    head = rollback_store(store, 1)
    assert head.generation == 1
    assert [(r.from_generation, r.to_generation) for r in head.rollbacks] == [(2, 1)]
    three = commit(store, 1, {"memory/m.md": b"1\n"}, "r3")
    assert [(g.number, g.parent, g.rollout) for g in list_generations(store)] == [
        (0, None, None),
        (1, 0, "r1"),
        (2, 1, "r2"),
        (3, 1, "r3"),
    ]
    assert three == 3 and load_head(store).rollbacks[0].to_generation == 1  # history kept
    # The same content in three generations is one blob.
    base = load_generation(store, 0).files["skills/base/SKILL.md"]
    assert load_generation(store, 1).files["skills/base/SKILL.md"] == base


def test_diff_of_generations(tmp_path: Path) -> None:
    store = tmp_path / "store"
    create_store(store)
    one = commit(store, 0, {"a.md": b"x\ny\n", "gone.md": b"old\n", "bin": b"\xff\x00"}, "r1")
    two = commit(store, one, {"a.md": b"x\nz\n", "new.md": b"hello\n", "bin": b"\xfe"}, "r2")
    old, new = load_generation(store, one), load_generation(store, two)
    changes = diff_files(old.files, new.files)
    assert (changes.added, changes.modified, changes.removed) == (["new.md"], ["a.md", "bin"], ["gone.md"])
    assert changes.describe() == "+new.md ~a.md ~bin -gone.md"
    text = "".join(unified_diff(store, old, new))
    assert "--- a/a.md\n+++ b/a.md\n" in text and "-y\n+z\n" in text
    assert "Binary files a/bin and b/bin differ" in text
    assert "--- /dev/null\n+++ b/new.md" in text and "--- a/gone.md\n+++ /dev/null" in text
    assert diff_files(new.files, new.files).describe() == "no change"


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a\\b"])
def test_unclean_store_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="path"):
        check_store_path(path)


def test_bad_stores_get_errors_naming_the_file(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    with pytest.raises(StoreError, match=r"job/store/head\.json: missing; .*job has no learner store"):
        rollback_store(job / "store", 0)
    store = job / "store"
    create_store(store)
    with pytest.raises(StoreError, match=r"7\.json: missing; the store has no generation 7 \(it has 0\)"):
        rollback_store(store, 7)
    manifest = store / "generations" / "0.json"
    manifest.write_text("{not json")
    with pytest.raises(StoreError, match=r"generations/0\.json: corrupt: invalid JSON"):
        load_generation(store, 0)
    manifest.write_text(json.dumps({"number": 0, "created_at": "t", "files": {"../escape": "0" * 64}}))
    with pytest.raises(StoreError, match=r"generations/0\.json: corrupt: not a clean relative path"):
        load_generation(store, 0)
    manifest.write_text(json.dumps({"number": 0, "created_at": "t", "files": {"a": "nothex"}}))
    with pytest.raises(StoreError, match=r"generations/0\.json: corrupt: a's hash 'nothex'"):
        load_generation(store, 0)
    manifest.write_text(json.dumps({"number": 5, "created_at": "t"}))
    with pytest.raises(StoreError, match=r"generations/0\.json: corrupt: it says it is generation 5"):
        load_generation(store, 0)
    (store / "head.json").write_text('{"generation": -1}')
    with pytest.raises(StoreError, match=r"head\.json: corrupt"):
        load_head(store)
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "link").symlink_to("/etc/passwd")
    with pytest.raises(StoreError, match=r"store seed .*seed: link is not a regular file"):
        create_store(tmp_path / "other", seed)


def test_a_hostile_store_is_refused_without_following_or_blocking(tmp_path: Path) -> None:
    """A shared job's store is data (issue 32): a blob that is a symlink out of it, or a manifest
    that is a FIFO nobody writes, is refused naming the file; nothing is followed or waited on."""
    store = tmp_path / "store"
    create_store(store)
    sha = put_blob(store, b"mine")
    blob = next((store / "objects").rglob(sha))
    blob.unlink()
    (tmp_path / "host-secret").write_bytes(b"mine")
    blob.symlink_to(tmp_path / "host-secret")
    with pytest.raises(StoreError, match=rf"{sha}: a symlink"):
        read_blob(store, sha)
    manifest = store / "generations" / "0.json"
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(StoreError, match=r"generations/0\.json: not a regular file"):
        load_generation(store, 0)
