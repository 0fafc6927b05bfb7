"""Classify one oracle rollout of a conformance run from the evidence its run folder holds.

A result is one of four classes:

- ``pass``: the rollout ended ``ok`` with the oracle's reward (``rewards.reward`` of 1.0 or more).
- ``needs-internet``: it failed and its logs show a host out of reach: a failed DNS lookup, a
  refused or unreachable download (pip, uv/uvx, npm, git, curl, Hugging Face, R's CRAN), or a FROM image
  of a registry or namespace of its own (``ghcr.io/org/image``, ``org/image``) that is not local.
  A task that asks for a host credential (``GH_TOKEN``, ``OPENAI_API_KEY`` in its compose file's
  ``environment``), which reroll refuses to pass, is ``needs-internet`` too: such a key is only of
  use to reach a remote service (GitHub's API, OpenAI's).
  A Docker Hub official image (``python:3.12``, ``ubuntu:20.04``, ``node:20``) that is not local is
  a ``reroll-defect`` instead: reroll's catalogue could stand in for it and does not (yet).
- ``task-broken``: it failed because the task's own files are incomplete: its Dockerfile COPYs a
  file the task folder lacks (e.g. a large file the corpus snapshot does not carry).
- ``reroll-defect``: any other failure: the task needs nothing out of reach and its files are
  whole, so reroll ran it differently from its own harness (or the stand-in image differs).

The class is read from evidence only (error text, verifier output, logs), never from a list of
task names; the evidence kept is the first line that decided the class and the last lines of the
verifier's output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

Verdict = Literal["pass", "reroll-defect", "needs-internet", "task-broken"]
VERDICTS: tuple[Verdict, ...] = ("pass", "reroll-defect", "needs-internet", "task-broken")

NETWORK_PATTERNS: tuple[str, ...] = (
    r"Temporary failure in name resolution",
    r"Could not resolve host",
    r"Name or service not known",
    r"nodename nor servname",
    r"getaddrinfo (?:ENOTFOUND|EAI_AGAIN|failed)",
    r"\bEAI_AGAIN\b",
    r"Failed to establish a new connection",
    r"Network is unreachable",
    r"No route to host",
    r"Could not fetch URL",
    r"No matching distribution found for",
    r"error sending request for url",
    r"Failed to download",
    r"dns error",
    r"unable to access 'https?://",
    r"Could not connect to (?:server|[\w.-]+:\d+)",
    r"connect(?:ion)? timed out",
    r"Max retries exceeded with url",
    r"pull access denied",
    r"LocalEntryNotFoundError",
    r"We couldn't connect to 'https://huggingface.co'",
    r"wget [^']*https?://[^']*' returned a non-zero code: 4\b",
    r"dial tcp: lookup \S+ on \S+: no such host",
    r"unable to access index for repository",
    r"cannot open URL '?https?://",
    r"asks for the host's \w+, which looks like a secret",
)
"""Lines that show a host out of reach (DNS, TCP, a package index, a registry)."""

BROKEN_PATTERNS: tuple[str, ...] = (
    r"COPY failed: .*(?:no such file or directory|not found)",
    r"failed to compute cache key: .*not found",
    r"failed to calculate checksum of ref .*not found",
)
"""Lines that show the task's own files are incomplete (a COPY of a file the folder lacks)."""

_UNPULLED = re.compile(r"starts FROM ([^\s,]+).*?which is not a local image and could not be pulled")
"""reroll's `ImageUnavailableError`: its first FROM image (the one the error names)."""
_NETWORK = re.compile("|".join(NETWORK_PATTERNS), re.IGNORECASE)
_BROKEN = re.compile("|".join(BROKEN_PATTERNS), re.IGNORECASE)
_SCANNED_BYTES = 2_000_000
"""At most this many bytes of each log file are read (its end)."""
_TAIL_LINES = 6


@dataclass(frozen=True)
class Classified:
    """One task's class, with the evidence for it."""

    task: str
    verdict: Verdict
    status: str
    reward: float | None
    evidence: str
    """The line that decided the class (or the error's first line); empty for a pass."""
    verifier_tail: str
    """The last lines of the verifier's output ('' when it never ran)."""


def is_official_image(image: str) -> bool:
    """Whether `image` (``python:3.12-slim``, ``docker.io/library/node:20``) is a Docker Hub
    official image, which reroll's catalogue could stand in for; False for another registry
    (``ghcr.io/…``, a first part with a dot or a port) or a namespace (``org/image``)."""
    name = image.split("@")[0]
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        name = name.removeprefix(prefix)
    name = name.removeprefix("library/")
    return "/" not in name


def _read_tail(path: Path) -> str:
    with path.open("rb") as handle:
        size = path.stat().st_size
        handle.seek(max(0, size - _SCANNED_BYTES))
        return handle.read().decode("utf-8", "replace")


def _logs(rollout: Path) -> list[tuple[Path, str]]:
    """The text files of a rollout folder worth scanning (not its trajectory), in path order."""
    found: list[tuple[Path, str]] = []
    for path in sorted(rollout.rglob("*")):
        if not path.is_file() or "trajectory" in path.parts or path.suffix in (".png", ".tar", ".gz"):
            continue
        try:
            found.append((path, _read_tail(path)))
        except OSError:
            continue
    return found


def _first_match(pattern: re.Pattern[str], texts: list[tuple[Path, str]], root: Path) -> str:
    for path, text in texts:
        for line in text.splitlines():
            if pattern.search(line):
                return f"{path.relative_to(root)}: {line.strip()[:300]}"
    return ""


def _verifier_tail(rollout: Path) -> str:
    for name in ("test-stdout.txt", "stdout.txt", "output.txt"):
        for path in sorted((rollout / "verifier").rglob(name)) if (rollout / "verifier").is_dir() else []:
            lines = [line for line in _read_tail(path).splitlines() if line.strip()]
            return "\n".join(lines[-_TAIL_LINES:])
    return ""


REACHABLE_HOSTS = r"(?:pypi\.org|files\.pythonhosted\.org|deb\.debian\.org|security\.debian\.org)"
"""The only hosts this machine reaches (PyPI and Debian's archive)."""
_DOWNLOAD = re.compile(
    r"\b(?:curl|wget|git\s+clone|urlretrieve|urlopen|requests\.get)\b[^\n]*?(?:https?|git)://(?!"
    + REACHABLE_HOSTS
    + r")([\w.-]+)"
)
STATIC_SOURCES: tuple[tuple[str, str], ...] = (
    ("tests/test.sh", "its verifier"),
    ("environment/Dockerfile", "its image build"),
    ("solution", "its reference solution"),
)
"""The task files whose downloads decide, before anything runs, that a phase needs a host out of
reach: (path in the task folder, the phase it is)."""


def _remote(host: str) -> bool:
    """Whether `host` is on the internet: not loopback, not a service of the task's own compose
    file (a name without a dot, ``api``)."""
    return "." in host and not host.startswith(("127.", "0.0.0.0")) and host != "localhost"


def classify_static(task_folder: Path) -> Classified | None:
    """``needs-internet`` for a task whose own files download from a host other than PyPI and
    Debian's archive (`STATIC_SOURCES`: ``curl … https://astral.sh/uv/install.sh | sh`` in its
    ``tests/test.sh``, a ``wget`` in its Dockerfile, a ``urlopen`` in its solution), with the line
    as evidence; None when none does (the task must be run to be classified). A download that the
    script would skip at run time still counts: a reading, not an execution."""
    for relative, phase in STATIC_SOURCES:
        source = task_folder / relative
        files = sorted(path for path in source.rglob("*") if path.is_file()) if source.is_dir() else [source]
        for path in files:
            if not path.is_file() or path.stat().st_size > _SCANNED_BYTES:
                continue
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                hosts = [match[1] for match in _DOWNLOAD.finditer(line) if _remote(match[1])]
                if hosts and not line.lstrip().startswith("#"):
                    where = path.relative_to(task_folder)
                    evidence = f"not run: {phase} downloads from {hosts[0]} ({where}: {line.strip()[:200]})"
                    return Classified(task_folder.name, "needs-internet", "not run", None, evidence, "")
    return None


def classify_refusal(task: str, message: str) -> Classified:
    """The class of task `task` that reroll refused to load (its `TaskError` `message`), so no
    rollout ran: ``task-broken`` when the message shows the task's own files incomplete (a file it
    names is missing), else ``reroll-defect`` (the task's harness would have run it)."""
    first = message.strip().splitlines()[0][:300] if message.strip() else "refused (no message)"
    evidence = f"refused when loading: {first}"
    verdict: Verdict = "task-broken" if _BROKEN.search(message) else "reroll-defect"
    return Classified(task, verdict, "refused", None, evidence, "")


def classify_rollout(rollout: Path, task: str) -> Classified:
    """The class of the oracle rollout in the run folder `rollout` of task `task`.

    Args:
        rollout: a run folder (``result.json``, ``verifier/``, ``harness/`` …); a folder without a
            ``result.json`` (the job died first) is a reroll defect.
        task: the task's name, as the table shows it.

    Returns:
        The class, the status and reward read from ``result.json``, and the evidence.
    """
    result_path = rollout / "result.json"
    result: dict[str, object] = {}
    if result_path.is_file():
        try:
            result = json.loads(result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = {}
    status = str(result.get("status") or "missing")
    rewards = result.get("rewards")
    reward = rewards.get("reward") if isinstance(rewards, dict) else None
    reward = float(reward) if isinstance(reward, (int, float)) else None
    tail = _verifier_tail(rollout)
    if status == "ok" and reward is not None and reward >= 1.0:
        return Classified(task, "pass", status, reward, "", tail)
    texts = _logs(rollout)
    error = str(result.get("error") or "")
    if error:
        texts.insert(0, (result_path, error))
    if evidence := _first_match(_BROKEN, texts, rollout):
        return Classified(task, "task-broken", status, reward, evidence, tail)
    if unpulled := _first_match(_UNPULLED, texts, rollout):
        image = re.findall(_UNPULLED, unpulled)[0]
        if not is_official_image(image):
            return Classified(task, "needs-internet", status, reward, unpulled, tail)
        evidence = f"no stand-in for the official image {image}: {unpulled}"
        return Classified(task, "reroll-defect", status, reward, evidence[:400], tail)
    if evidence := _first_match(_NETWORK, texts, rollout):
        return Classified(task, "needs-internet", status, reward, evidence, tail)
    category = str(result.get("error_category") or "")
    first = error.strip().splitlines()[0][:300] if error.strip() else ""
    if not result:
        first = "no result.json (the rollout never finished)"
    elif not first:
        first = f"status {status}, reward {reward}"
    return Classified(task, "reroll-defect", status, reward, f"{category}: {first}".strip(": "), tail)


def apply_reviews(results: list[Classified], reviewed: Path) -> list[Classified]:
    """`results` with the failures a person examined taken from `reviewed`: a YAML map of task
    name → ``{class: VERDICT, evidence: TEXT}`` (the evidence says what was run and seen, e.g.
    the reference solution failing the same way outside reroll). A pass is never overridden;
    an entry whose task passed or was not measured is ignored.

    Raises:
        ValueError: the file is not such a map, or names a class outside `VERDICTS`.
    """
    entries = yaml.safe_load(reviewed.read_text(encoding="utf-8")) or {}
    if not isinstance(entries, dict):
        raise ValueError(f"{reviewed}: not a map of task names")
    reviews: dict[str, tuple[Verdict, str]] = {}
    for task, entry in entries.items():
        verdict = entry.get("class") if isinstance(entry, dict) else None
        if verdict not in VERDICTS or verdict == "pass" or not str(entry.get("evidence") or "").strip():
            raise ValueError(f"{reviewed}: {task}: needs a class of {VERDICTS[1:]} and an evidence text")
        reviews[str(task)] = (verdict, " ".join(str(entry["evidence"]).split()))
    return [
        Classified(
            row.task,
            reviews[row.task][0],
            row.status,
            row.reward,
            f"reviewed: {reviews[row.task][1]}",
            row.verifier_tail,
        )
        if row.task in reviews and row.verdict != "pass"
        else row
        for row in results
    ]
