"""Generate the Python code of the sidecar contract from ``protos/reroll_protos/sidecar/v1/sidecar.proto``.

Writes ``sidecar_pb2.py``, ``sidecar_pb2.pyi``, ``sidecar_pb2_grpc.py`` and ``sidecar_pb2_grpc.pyi``
next to the .proto (they are committed), with ``-I protos`` so the generated imports read
``from reroll_protos.sidecar.v1 import sidecar_pb2``. Needs grpcio-tools and mypy-protobuf.

Usage::

    python scripts/gen_protos.py            # regenerate in place (`make protos`)
    python scripts/gen_protos.py --check    # exit 1 if the committed code is stale
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO = Path("reroll_protos/sidecar/v1/sidecar.proto")
GENERATED = ("sidecar_pb2.py", "sidecar_pb2.pyi", "sidecar_pb2_grpc.py", "sidecar_pb2_grpc.pyi")


def _plugin(name: str) -> str:
    """The path of protoc plugin `name`: beside this interpreter (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        sys.exit(f"{name} not found; install mypy-protobuf (pip install -e '.[dev]')")
    return found


def generate(out_dir: Path) -> None:
    """Run protoc on the contract, writing the generated files under `out_dir` (a package root)."""
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        str(PROTO_ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        sys.exit(f"protoc failed on {PROTO_ROOT / PROTO}")


def main() -> int:
    """Regenerate the code in place, or with ``--check`` compare a fresh generation with it."""
    parser = argparse.ArgumentParser(description="Generate the Python code of the sidecar contract.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed code is stale")
    check = parser.parse_args().check
    target = PROTO_ROOT / PROTO.parent
    if not check:
        generate(PROTO_ROOT)
        print(f"generated {', '.join(GENERATED)} in {target.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / PROTO.parent
        stale = [
            name
            for name in GENERATED
            if not (target / name).exists() or not filecmp.cmp(fresh / name, target / name, shallow=False)
        ]
    if stale:
        print(f"generated code is stale ({', '.join(stale)}); run make protos", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
