"""The catalogue's stand-ins for ``python:3.10`` and ``python:3.12`` (`reroll.sandbox.docker.catalogue`):
Debian bookworm with the host's CPython 3.X installed at ``/usr/local``, as the official ``python``
images have theirs.

Debian ships neither minor (bookworm has 3.11, trixie 3.13) and PyPI ships no interpreter, so the
host's own build is the only CPython 3.10 or 3.12 reroll can have, as for the agents' runtime
(`reroll.installs.python_runtime`; `reroll.host.pythons.host_python` finds it: pyenv's newest ``3.X.*``, else
``python3.X`` on PATH). That runtime must run in any image, so it bundles the host's C library,
ELF loader and every library beside the interpreter. This image needs none of that: it is the
host's own Debian release (bookworm, what reroll's machines run), against whose libraries pyenv
built the interpreter, so the image installs the same libraries from Debian's archive
(`PACKAGES`: OpenSSL, libffi, SQLite, … much as the official slim images carry) and the
interpreter, and every extension module a task's pip downloads or compiles, use the image's own
C library like any other program of the image. The one thing patched in the ELF files is their
RUNPATH, which names the host's pyenv folder: it is removed, and the image's ``ldconfig`` finds
``/usr/local/lib`` (as in the official images). The host's prefix written into the build
configuration (``sysconfig``'s data, the ``python-config`` script and Makefile, pkg-config) is
rewritten to ``/usr/local``, so a C extension built in the image neither looks for nor links
anything of the host's.

What `install` puts into the image (``X`` the minor):

- ``/usr/local/bin``: ``python3.X`` with ``python3`` and ``python`` linked to it,
  ``python3.X-config`` (``python3-config``, ``python-config``), and ``pip``, ``pip3``,
  ``pip3.X`` from the interpreter's own ``ensurepip`` (the pip wheel it bundles, no network;
  3.10's installs setuptools too), installing system-wide (there is no PEP 668 marker), as in
  the official images;
- ``/usr/local/lib``: ``libpython3.X.so*``, ``pkgconfig``, and the standard library without its
  tests, IDLE, tkinter, turtledemo, the static library, the host's ``site-packages`` and byte
  code (`LEFT_OUT`); an extension module of it that links a library the image lacks is removed
  (and logged) rather than left to fail at import (``_tkinter`` on pyenv's builds);
- ``/usr/local/include/python3.X``: the C headers (``Python.h``) a source build compiles against.

The image's tag hashes the host interpreter's path, size and time (`identity`): another build
of the host's CPython makes another image. Building it takes about a minute beyond the debootstrap.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from reroll_contracts.errors import ImageBuildError

from reroll.host.pythons import PYENV_VERSIONS, host_python
from reroll.sandbox.sidecar_bundle import elf_files, patchelf_program, run_build_step

PREFIX = "/usr/local"
"""Where the interpreter is installed in the image, as in the official ``python`` images."""
PACKAGES = (
    "ca-certificates",
    "netbase",
    "tzdata",
    "libbz2-1.0",
    "libcrypt1",
    "libexpat1",
    "libffi8",
    "libgdbm6",
    "libgdbm-compat4",
    "liblzma5",
    "libncursesw6",
    "libnsl2",
    "libreadline8",
    "libsqlite3-0",
    "libssl3",
    "libtinfo6",
    "libtirpc3",
    "libuuid1",
    "zlib1g",
)
"""Debian bookworm packages of the libraries CPython's extension modules link (and what the
official slim images also carry: CA certificates, ``/etc/services``, time zones)."""
LEFT_OUT = (
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "site-packages",
    "__pycache__",
    "libpython*.a",
    "python.o",
)
"""Names left out of the copy of the host's ``lib/python3.X`` (``site-packages``: the host's
packages; ``ensurepip`` makes a fresh one with pip)."""
ESSENTIAL = "import ssl, sqlite3, ctypes, lzma, bz2, zlib, hashlib, decimal, uuid, readline, venv, ensurepip"
"""Modules checked to import in the image: one missing is a build error, not a dropped module."""
_RECIPE = "host CPython at /usr/local; RUNPATH removed; prefix rewritten; ensurepip; v1"
"""Changing how the interpreter is installed must change the image's hash: bump this text with it."""
_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
}
"""The environment of the commands run in the image's root (none of the host's ``PIP_*`` or ``PYTHON*``)."""


def identity(minor: str) -> str:
    """What the stand-in of `minor` (``3.12``) is made of, for its tag's hash: the host
    interpreter's resolved path (pyenv's names its version, ``3.12.1``), the size and modification
    time of it and of its libpython (a rebuild in place changes them), and `_RECIPE`; ``absent``
    when the host has none. Nothing is run: this is asked whenever a catalogue tag is named."""
    python = host_python(minor)
    if python is None:
        return "absent"
    stamps = []
    for path in (python, python.parent.parent / "lib" / f"libpython{minor}.so.1.0"):
        try:
            stat = path.stat()
        except OSError:
            stamps.append(f"{path.name}: missing")
        else:
            stamps.append(f"{path.name}: {stat.st_size} {stat.st_mtime_ns}")
    return "\0".join([str(python), *stamps, _RECIPE])


def install(root: Path, minor: str, log: Callable[[str], None]) -> None:
    """Install the host's CPython `minor` (``3.12``) at `PREFIX` in the Debian root file system
    `root` (debootstrapped with `PACKAGES`), as the module's docstring describes.

    Raises:
        ImageBuildError: the host has no CPython `minor`, it is not a shared build
            (``--enable-shared``), or a step failed (patchelf, ldconfig, ensurepip, the check
            that `ESSENTIAL` imports).
    """
    python = host_python(minor)
    if python is None:
        raise ImageBuildError(
            f"the stand-in for python:{minor} installs the host's CPython {minor}, and this host has "
            f"none (pyenv's under {PYENV_VERSIONS}, or python{minor} on PATH)"
        )
    home = python.parent.parent
    library = f"libpython{minor}.so.1.0"
    if not (home / "lib" / library).is_file():
        raise ImageBuildError(f"{python}: not a CPython built with --enable-shared under {home}")
    log(f"installing the host's CPython {minor} ({home}) at {PREFIX}")
    target = root / PREFIX.lstrip("/")
    _copy(home, target, minor)
    patchelf = patchelf_program()
    for path in elf_files(target):
        run_build_step([patchelf, "--remove-rpath", str(path)], f"patchelf --remove-rpath {path.name}")
    _rewrite_prefix(target, str(home), PREFIX)
    _in_root(root, ["ldconfig"], "ldconfig")
    for module in _unloadable(root, minor):
        log(f"python:{minor} stand-in: {module.rsplit('/', 1)[-1]} links a library the image lacks: removed")
        (root / module.lstrip("/")).unlink()
    _in_root(root, [f"python{minor}", "-m", "ensurepip", "--default-pip"], f"ensurepip of Python {minor}")
    _in_root(root, ["python3", "-c", ESSENTIAL], f"the standard library of Python {minor} in the image")


def _copy(home: Path, target: Path, minor: str) -> None:
    """Copy the installation at `home` (pyenv's ``3.X.Y``) into `target` (the image's ``/usr/local``):
    the interpreter and its names, the config script, libpython, the standard library, the headers,
    pkg-config's files."""
    bin_dir, lib_dir = target / "bin", target / "lib"
    bin_dir.mkdir(parents=True, exist_ok=True)
    lib_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(home / "bin" / f"python{minor}", bin_dir)
    shutil.copy2(home / "bin" / f"python{minor}-config", bin_dir)
    for name, points_to in (
        ("python3", f"python{minor}"),
        ("python", f"python{minor}"),
        ("python3-config", f"python{minor}-config"),
        ("python-config", f"python{minor}-config"),
    ):
        (bin_dir / name).unlink(missing_ok=True)
        (bin_dir / name).symlink_to(points_to)
    for path in (home / "lib").glob("libpython*.so*"):
        shutil.copy2(path, lib_dir, follow_symlinks=False)
    stdlib = f"python{minor}"
    shutil.copytree(
        home / "lib" / stdlib, lib_dir / stdlib, symlinks=True, ignore=shutil.ignore_patterns(*LEFT_OUT)
    )
    (lib_dir / stdlib / "site-packages").mkdir()
    shutil.copytree(home / "lib" / "pkgconfig", lib_dir / "pkgconfig", symlinks=True, dirs_exist_ok=True)
    shutil.copytree(home / "include" / stdlib, target / "include" / stdlib, symlinks=True)


def _rewrite_prefix(folder: Path, old: str, new: str) -> None:
    """Replace `old` by `new` in every file under `folder` that is not ELF and contains it."""
    before, after = old.encode(), new.encode()
    for path in folder.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        content = path.read_bytes()
        if before in content and not content.startswith(b"\x7fELF"):
            path.write_bytes(content.replace(before, after))


def _in_root(root: Path, argv: list[str], what: str) -> str:
    """Run `argv` in `root` (``chroot``) with `_ENV`; its standard output.

    Raises:
        ImageBuildError: it failed (naming `what`, with its output's end).
    """
    return run_build_step(["chroot", str(root), *argv], what, env=_ENV)


def _unloadable(root: Path, minor: str) -> list[str]:
    """The image paths of the standard library's extension modules in `root` that link a library
    the image lacks (``ldd`` in the image says ``not found``)."""
    script = (
        f"for f in {PREFIX}/lib/python{minor}/lib-dynload/*.so; do "
        'ldd "$f" 2>/dev/null | grep -q "not found" && echo "$f"; done; true'
    )
    return _in_root(root, ["sh", "-c", script], "ldd of the extension modules").split()
