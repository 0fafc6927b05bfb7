"""A job's learner store: versioned, content-addressed generations of skills and memory files.

A ``sequential-shared`` job (`reroll.jobs.learning`) runs its rollouts one after another over
one store; each rollout starts from the head generation g and the store as its agent left it
becomes generation g+1 (parent g). ``reroll store rollback`` moves the head back to an earlier
generation (the next rollout starts from it); no generation is ever deleted or changed, and
every rollback is recorded in the head file::

    <job>/store/
      head.json                 StoreHead: the generation the next rollout starts from, the rollbacks
      generations/<n>.json      Generation n: parent, rollout, reward, {path: sha256} of its files
      objects/<ab>/<sha256>     every file content once (sha256 of the bytes; ab = its first 2 digits)

The store's own layout (what the agent sees): ``skills/<name>/SKILL.md`` (each agent's native
skills) and ``memory/`` (free-form files). Only regular files are versioned: no folders of their
own, no modes (every file is 0644 in the sandbox), no symlinks.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from pathlib import Path, PurePosixPath
from typing import TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reroll_contracts.datafile import DataFileError, read_data_file
from reroll_contracts.errors import StoreError

from reroll.runfolder.run import MAX_JSON_BYTES, now_iso, write_bytes_atomically, write_json
from reroll.runfolder.summary import GenerationSummary, StoreDiff, primary_reward

STORE_DIR = "store"
"""In a job folder: its learner store."""
HEAD_FILE = "head.json"
GENERATIONS_DIR = "generations"
OBJECTS_DIR = "objects"
SKILLS_DIR = "skills"
"""In the store: the skills, one folder per skill holding its ``SKILL.md``."""
MEMORY_DIR = "memory"
"""In the store: memory files."""
MAX_STORE_FILE_BYTES = 8 * 1024 * 1024
"""The largest file taken into the store; a larger one is left out (and said so)."""
MAX_STORE_BYTES = 64 * 1024 * 1024
"""The most bytes one generation's files take; files past it are left out."""
M = TypeVar("M", bound=BaseModel)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class Generation(BaseModel):
    """``generations/<n>.json``: one version of the store."""

    model_config = ConfigDict(extra="forbid")
    number: int = Field(ge=0)
    parent: int | None = None
    """The generation it was made from; None for generation 0 (the store's initial contents)."""
    rollout: str | None = None
    """The run folder (in the job folder) whose agent left it; None for generation 0."""
    status: str | None = None
    """That rollout's status (``ok``, ``timeout``, ``error``)."""
    rewards: dict[str, float] | None = None
    """That rollout's rewards (None: it got none)."""
    created_at: str
    files: dict[str, str] = Field(default_factory=dict)
    """``{path relative to the store: sha256 hex}``; the contents are in ``objects/``."""

    @property
    def reward(self) -> float | None:
        """The primary reward of its rollout (`reroll.runfolder.summary.primary_reward`)."""
        return primary_reward(self.rewards)


class Rollback(BaseModel):
    """One ``reroll store rollback``: the head moved from one generation to an earlier one."""

    model_config = ConfigDict(extra="forbid")
    from_generation: int
    to_generation: int
    at: str


class StoreHead(BaseModel):
    """``head.json``: where the next rollout starts, and every rollback so far."""

    model_config = ConfigDict(extra="forbid")
    generation: int = Field(ge=0)
    """The generation the next rollout of the job starts from."""
    rollbacks: list[Rollback] = Field(default_factory=list)


def store_of(job_dir: Path) -> Path:
    """The learner store folder of the job in `job_dir` (it may not exist)."""
    return job_dir / STORE_DIR


def diff_files(old: dict[str, str], new: dict[str, str]) -> StoreDiff:
    """What changed from `old` to `new` (``{path: sha256}`` each)."""
    return StoreDiff(
        added=sorted(new.keys() - old.keys()),
        modified=sorted(path for path in old.keys() & new.keys() if old[path] != new[path]),
        removed=sorted(old.keys() - new.keys()),
    )


def check_store_path(path: str) -> str:
    """`path` if it is a clean relative path inside the store (no ``..``, not absolute, no empty
    or ``.`` parts), else ValueError saying why."""
    parts = PurePosixPath(path).parts
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a clean relative path: {path!r}")
    if str(PurePosixPath(*parts)) != path:
        raise ValueError(f"not a normalised path: {path!r}")
    return path


def put_blob(store: Path, data: bytes) -> str:
    """Store `data` under its sha256 (once: an existing blob is kept); its sha256 hex."""
    sha = hashlib.sha256(data).hexdigest()
    blob = _blob_path(store, sha)
    if not blob.is_file():
        write_bytes_atomically(blob, [data])
    return sha


def read_blob(store: Path, sha: str) -> bytes:
    """The content stored under `sha`.

    Raises:
        StoreError: the blob is missing, or its content does not hash to `sha` (the message names it).
    """
    blob = _blob_path(store, sha)
    try:
        data = read_data_file(blob, MAX_STORE_FILE_BYTES, root=store)
    except DataFileError as exc:
        raise StoreError(f"{blob}: {exc}") from exc
    except OSError as exc:
        raise StoreError(f"{blob}: cannot be read ({exc.strerror or exc})") from exc
    if hashlib.sha256(data).hexdigest() != sha:
        raise StoreError(f"{blob}: corrupt (its content does not hash to its name)")
    return data


def generation_files(store: Path, generation: Generation) -> dict[str, bytes]:
    """``{path: content}`` of every file of `generation`.

    Raises:
        StoreError: a blob is missing or corrupt.
    """
    return {path: read_blob(store, sha) for path, sha in generation.files.items()}


def create_store(store: Path, seed: Path | None = None) -> StoreHead:
    """Create the store with generation 0 holding the regular files under `seed` (none: empty);
    a store that exists already is left as it is (a resumed job). Its head.

    Raises:
        StoreError: `seed` is not a folder, holds a symlink or a file over the limits, or an
            existing store's head.json is corrupt.
    """
    if (store / HEAD_FILE).exists():
        return load_head(store)
    files: dict[str, str] = {}
    if seed is not None:
        if not seed.is_dir():
            raise StoreError(f"store seed {seed}: not a folder")
        total = 0
        for file in sorted(seed.rglob("*")):
            relative = file.relative_to(seed).as_posix()
            if file.is_symlink() or not (file.is_file() or file.is_dir()):
                raise StoreError(f"store seed {seed}: {relative} is not a regular file or folder")
            if file.is_dir():
                continue
            data = file.read_bytes()
            total += len(data)
            if len(data) > MAX_STORE_FILE_BYTES or total > MAX_STORE_BYTES:
                raise StoreError(f"store seed {seed}: {relative} is past the store's size limits")
            files[relative] = put_blob(store, data)
    _write_generation(store, Generation(number=0, created_at=now_iso(), files=files))
    head = StoreHead(generation=0)
    write_json(store / HEAD_FILE, head)
    return head


def load_head(store: Path) -> StoreHead:
    """The store's head.json.

    Raises:
        StoreError: the store or its head.json is missing (not a ``sequential-shared`` job), or
            the file is corrupt; the message names it.
    """
    file = store / HEAD_FILE
    if not file.exists():
        raise StoreError(
            f"{file}: missing; {store.parent} has no learner store (only a job run with "
            "--schedule sequential-shared has one)"
        )
    return _validated(StoreHead, file)


def load_generation(store: Path, number: int) -> Generation:
    """Generation `number` of the store.

    Raises:
        StoreError: the store has no such generation, or its file is corrupt (a bad path or hash
            in it included); the message names the file.
    """
    file = store / GENERATIONS_DIR / f"{number}.json"
    if not file.exists():
        load_head(store)  # no store at all: say that instead
        known = ", ".join(str(g.number) for g in list_generations(store))
        raise StoreError(f"{file}: missing; the store has no generation {number} (it has {known})")
    generation = _validated(Generation, file)
    if generation.number != number:
        raise StoreError(f"{file}: corrupt: it says it is generation {generation.number}")
    for path, sha in generation.files.items():
        try:
            check_store_path(path)
        except ValueError as exc:
            raise StoreError(f"{file}: corrupt: {exc}") from None
        if not _SHA256.match(sha):
            raise StoreError(f"{file}: corrupt: {path}'s hash {sha!r} is not a sha256 hex digest")
    return generation


def list_generations(store: Path) -> list[Generation]:
    """Every generation of the store, by number.

    Raises:
        StoreError: as `load_head` and `load_generation`.
    """
    load_head(store)
    numbers = sorted(
        int(file.stem) for file in (store / GENERATIONS_DIR).glob("*.json") if file.stem.isdigit()
    )
    return [load_generation(store, number) for number in numbers]


def find_generation(store: Path, rollout: str) -> Generation | None:
    """The generation rollout `rollout` (a run folder's name) made, if it made one.

    Raises:
        StoreError: as `list_generations`.
    """
    return next((g for g in list_generations(store) if g.rollout == rollout), None)


def commit_generation(
    store: Path,
    *,
    parent: int,
    files: dict[str, str],
    rollout: str,
    status: str | None,
    rewards: dict[str, float] | None,
) -> Generation:
    """Record `files` (blobs already stored) as the next generation, made by `rollout` from
    `parent`, and move the head to it.

    Raises:
        StoreError: the store is missing or corrupt, `parent` does not exist, a blob is missing,
            or a path is not clean.
    """
    load_generation(store, parent)
    for path, sha in files.items():
        try:
            check_store_path(path)
        except ValueError as exc:
            raise StoreError(f"{rollout}: learner store: {exc}") from None
        if not _blob_path(store, sha).is_file():
            raise StoreError(f"{_blob_path(store, sha)}: missing (a file of {rollout}'s store: {path})")
    number = max(g.number for g in list_generations(store)) + 1
    generation = Generation(
        number=number,
        parent=parent,
        rollout=rollout,
        status=status,
        rewards=rewards,
        created_at=now_iso(),
        files=dict(sorted(files.items())),
    )
    _write_generation(store, generation)
    head = load_head(store)
    write_json(store / HEAD_FILE, head.model_copy(update={"generation": number}))
    return generation


def rollback_store(store: Path, number: int) -> StoreHead:
    """Move the head to generation `number` (the next rollout starts from it); recorded in head.json.

    Raises:
        StoreError: the store is missing or corrupt, or has no generation `number`.
    """
    load_generation(store, number)
    head = load_head(store)
    moved = head.model_copy(
        update={
            "generation": number,
            "rollbacks": [
                *head.rollbacks,
                Rollback(from_generation=head.generation, to_generation=number, at=now_iso()),
            ],
        }
    )
    write_json(store / HEAD_FILE, moved)
    return moved


def summarise_store(store: Path) -> list[GenerationSummary]:
    """Per generation: its parent, rollout, status, reward and what changed from its parent.

    Raises:
        StoreError: the store is missing or corrupt.
    """
    generations = {g.number: g for g in list_generations(store)}
    head = load_head(store).generation
    summaries = []
    for number, generation in generations.items():
        parent = generations.get(generation.parent) if generation.parent is not None else None
        changes = diff_files(parent.files if parent is not None else {}, generation.files)
        summaries.append(
            GenerationSummary(
                generation=number,
                parent=generation.parent,
                rollout=generation.rollout,
                status=generation.status,
                reward=generation.reward,
                files=len(generation.files),
                changes=changes,
                head=number == head,
            )
        )
    return summaries


def _blob_path(store: Path, sha: str) -> Path:
    return store / OBJECTS_DIR / sha[:2] / sha


def _write_generation(store: Path, generation: Generation) -> None:
    write_json(store / GENERATIONS_DIR / f"{generation.number}.json", generation)


def _validated(model: type[M], file: Path) -> M:
    """`file` read and validated as `model`; StoreError naming it when it cannot be."""
    try:
        return model.model_validate(orjson.loads(read_data_file(file, MAX_JSON_BYTES)))
    except DataFileError as exc:
        raise StoreError(f"{file}: {exc}") from exc
    except OSError as exc:
        raise StoreError(f"{file}: cannot be read ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"{file}: corrupt: invalid JSON: {exc}") from exc
    except ValidationError as exc:
        raise StoreError(f"{file}: corrupt:\n{exc}") from exc


def unified_diff(store: Path, old: Generation | None, new: Generation) -> list[str]:
    """The changes from `old` (None: an empty store) to `new` as a unified diff, file by file
    (``a/<path>``, ``b/<path>``); a file that is not UTF-8 text is one line, ``Binary files … differ``.

    Raises:
        StoreError: a blob is missing or corrupt.
    """
    before = old.files if old is not None else {}
    changes = diff_files(before, new.files)
    lines: list[str] = []
    for path in sorted([*changes.added, *changes.modified, *changes.removed]):
        texts = [_text(store, files.get(path)) for files in (before, new.files)]
        if any(text is None for text in texts):
            lines.append(f"Binary files a/{path} and b/{path} differ\n")
            continue
        a, b = (text or "" for text in texts)
        lines.extend(
            difflib.unified_diff(
                a.splitlines(keepends=True),
                b.splitlines(keepends=True),
                f"a/{path}" if path in before else "/dev/null",
                f"b/{path}" if path in new.files else "/dev/null",
            )
        )
    return lines


def _text(store: Path, sha: str | None) -> str | None:
    """The blob `sha` as UTF-8 text ("" for no blob); None when it is not text."""
    if sha is None:
        return ""
    try:
        return read_blob(store, sha).decode()
    except UnicodeDecodeError:
        return None
