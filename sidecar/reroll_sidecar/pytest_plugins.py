"""Which pytest plugins the verifier may load, from a scan of the sandbox's ``python3``.

The verifier's pytest runs with plugin autoloading off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``), so
a plugin the agent installed never loads by itself. The plugins that stay loadable, as BenchFlow
has it (its ``[verifier] pytest_plugins`` and "auto-discovered root-owned plugins"), are passed to
pytest explicitly as ``-p NAME`` (`addopts`):

- the task's declared ones (``verifier.pytest_plugins``; entry-point or module names), and
- the image's own: ``pytest11`` entry points of the sandbox's ``python3`` (its ``sys.path`` in
  isolated mode: no user site, no ``PYTHONPATH``) whose distribution is *trusted* — its metadata
  folder and the plugin's top-level module or package lie in the same site directory, every file
  and folder of them is owned by root and writable by nobody else (group root excepted), and so
  is every folder from ``/`` down to them (a sticky folder such as ``/tmp`` excepted). `scan`
  runs before the agent (PrepareVerify) and again before the test script (Verify); a name is
  loaded only if it was trusted both times, and never when some distribution seen at Verify
  offers the same name untrusted (pytest loads the first one on ``sys.path``, which could be
  the agent's).

Residual risk (docs/security.md's): an agent running as root can edit a trusted plugin's files; a
``pytest`` started from an agent-writable folder with ``python -m pytest`` imports from that folder
first (as it would ``pytest`` itself); a test script that runs pytest from another environment
(``uvx``, a venv) gets the same ``-p`` names, and pytest stops with "Error importing plugin"
when one of the image's is missing there.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from dataclasses import dataclass, field

from reroll_contracts.errors import VerifyError

SCAN_TIMEOUT_SECONDS = 60.0

# Run by the sandbox's python3 in isolated mode (-I) as the sidecar's user, with / as its folder.
# Prints {"site_dirs": [...], "trusted": {name: dist folder}, "untrusted": {name: dist folder}}.
_SCAN_SCRIPT = r"""
import configparser, json, os, site, stat, sys, sysconfig
dirs = set(site.getsitepackages()) | {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
dirs |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}

def writable_by_others(st):
    return st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)

def safe_chain(path):
    # Every folder from / down to path (as given and resolved) is root's; symlinks root-owned.
    for candidate in (os.path.abspath(path), os.path.realpath(path)):
        parts, prefix = candidate.split("/")[1:], "/"
        for part in [""] + parts:
            prefix = os.path.join(prefix, part)
            st = os.lstat(prefix)
            if st.st_uid != 0:
                return False
            sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and prefix != candidate
            if not stat.S_ISLNK(st.st_mode) and writable_by_others(st) and not sticky:
                return False
    return True

def safe_tree(path):
    if not safe_chain(path):
        return False
    for base, folders, files in os.walk(path):
        for name in folders + files:
            entry = os.path.join(base, name)
            st = os.lstat(entry)
            if st.st_uid != 0 or (not stat.S_ISLNK(st.st_mode) and writable_by_others(st)):
                return False
            if stat.S_ISLNK(st.st_mode) and not safe_chain(entry):
                return False
    return True

def module_paths(site_dir, names, module):
    # The plugin's top-level package folder, module file or extension among site_dir's names.
    top = module.split(":")[0].strip().split(".")[0]
    found = []
    for name in names:
        path = os.path.join(site_dir, name)
        if name == top + ".py" or (name == top and os.path.isdir(path)):
            found.append(path)
        elif name.startswith(top + ".") and name.endswith((".so", ".pyd")):
            found.append(path)
    return found

trusted, untrusted = {}, {}
for entry in sys.path:  # in sys.path's order, as pytest meets them (importlib.metadata is slower)
    try:
        names = os.listdir(entry)
    except OSError:
        continue
    metas = sorted(n for n in names if n.endswith((".dist-info", ".egg-info")))
    for meta in metas:
        folder = os.path.join(entry, meta)
        points = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        points.optionxform = str
        try:
            points.read(os.path.join(folder, "entry_points.txt"), encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            continue
        for name, value in points.items("pytest11") if points.has_section("pytest11") else []:
            try:
                paths = module_paths(entry, names, value)
                ok = bool(paths) and safe_tree(folder) and all(safe_tree(p) for p in paths)
            except OSError:
                ok = False
            (trusted if ok else untrusted).setdefault(name, folder)
print(json.dumps({"site_dirs": sorted(d for d in dirs if d), "trusted": trusted, "untrusted": untrusted}))
"""


@dataclass(frozen=True)
class Scan:
    """What the sandbox's ``python3`` holds: its site directories and its pytest plugins.

    An image without ``python3`` has none of either.
    """

    site_dirs: list[str] = field(default_factory=list)
    """Its site directories (absolute paths)."""
    trusted: dict[str, str] = field(default_factory=dict)
    """Trusted ``pytest11`` entry points: name → the distribution's metadata folder."""
    untrusted: dict[str, str] = field(default_factory=dict)
    """The other ``pytest11`` entry points (some file is not root's, or the module lies elsewhere)."""
    error: str = ""
    """Why the scan failed (`scan_or_error`); then it found nothing."""


async def scan(env: dict[str, str]) -> Scan:
    """Run the scan (module docstring) with the ``python3`` found in `env`'s PATH, from ``/``.

    Raises:
        VerifyError: ``failed`` when python3 cannot be run, fails, or takes longer than
            `SCAN_TIMEOUT_SECONDS`.
    """
    try:
        child = await asyncio.create_subprocess_exec(
            "python3",
            "-I",
            "-c",
            _SCAN_SCRIPT,
            env=env,
            cwd="/",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        return Scan()  # an image without python3: nothing to scan (the agent's later ones are new)
    except OSError as exc:
        raise VerifyError("failed", f"cannot run python3 to scan its site directories: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(child.communicate(), SCAN_TIMEOUT_SECONDS)
    except asyncio.TimeoutError as exc:  # noqa: UP041 - the sidecar also runs on Python 3.10
        child.kill()
        await child.wait()
        raise VerifyError(
            "failed", f"python3 did not scan its site directories in {SCAN_TIMEOUT_SECONDS:.0f} s"
        ) from exc
    if child.returncode != 0:
        raise VerifyError("failed", f"python3 failed to scan its site directories: {err.decode()[-2000:]}")
    found = json.loads(out)
    return Scan(site_dirs=found["site_dirs"], trusted=found["trusted"], untrusted=found["untrusted"])


async def scan_or_error(env: dict[str, str]) -> Scan:
    """`scan`, or an empty `Scan` carrying the error when it fails: the image's plugins are then
    not loaded (the declared ones are), and the hardening report says why."""
    try:
        return await scan(env)
    except VerifyError as exc:
        return Scan(error=str(exc))


@dataclass(frozen=True)
class Allowed:
    """The plugins the test script's pytest gets (`allowed`), and the notes for the hardening report."""

    names: list[str]
    notes: list[str]


def allowed(declared: list[str], before: Scan, now: Scan) -> Allowed:
    """The plugins to load: the `declared` ones and those trusted in both scans (`before` the
    agent, `now` before the test script), less every name `now` also finds untrusted.

    Returns:
        The names, sorted, and one note for what was loaded (each name followed by its sources,
        ``declared`` and/or ``image``) and one per plugin left out.
    """
    sources: dict[str, str] = {}
    notes: list[str] = []
    for name in sorted(set(declared) | set(before.trusted) | set(before.untrusted) | set(now.untrusted)):
        image = name in before.trusted and now.trusted.get(name) == before.trusted[name]
        if name in now.untrusted:
            notes.append(
                f"pytest plugin {name!r} not loaded: {now.untrusted[name]} is writable by others than root"
                " or its module lies elsewhere"
            )
        elif name in declared or image:
            sources[name] = ", ".join(
                s for s, yes in (("declared", name in declared), ("image", image)) if yes
            )
        elif name in before.trusted:
            notes.append(
                f"pytest plugin {name!r} not loaded: {before.trusted[name]} changed since the agent started"
            )
        else:
            notes.append(f"pytest plugin {name!r} not loaded: {before.untrusted[name]} is not root's alone")
    notes += [
        f"the image's pytest plugins are not loaded: {scan.error}" for scan in (before, now) if scan.error
    ]
    if sources:
        loaded = ", ".join(f"{name} ({source})" for name, source in sorted(sources.items()))
        notes.insert(0, f"pytest plugins loaded (-p): {loaded}")
    return Allowed(sorted(sources), notes)


def addopts(names: list[str]) -> str:
    """``" -p NAME"`` for each of `names` (entry-point or module names), for ``PYTEST_ADDOPTS``."""
    return "".join(f" -p {shlex.quote(name)}" for name in names)
