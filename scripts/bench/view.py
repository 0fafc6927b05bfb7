"""Benchmark: ``reroll view`` of a 1,000-exchange run and of a 100-rollout job.

    .venv/bin/python scripts/bench/view.py [--exchanges 1000] [--rollouts 100]
        [--rollout-exchanges 20]

Writes the synthetic run folders of scripts/bench/export.py (Chat Completions, every request
holding the whole conversation so far, one tool call and its result per exchange) into a
temporary folder, then times, in this process, loading them (`reroll.runfolder.run.load_run_folder`
on every run folder: the baseline) and building their site (`reroll.view.build_site`, loading
included). Prints seconds, the ratio of the build to the baseline measured in the same run, and
the site's size.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from reroll.export import sources
from reroll.view import build_site

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export import workloads  # the same synthetic runs as the export benchmark


def measure(label: str, path: Path, site: Path) -> None:
    start = time.perf_counter()
    loaded = sum(1 for _ in sources(path))
    load = time.perf_counter() - start
    start = time.perf_counter()
    build_site(path, site)
    build = time.perf_counter() - start
    size = sum(file.stat().st_size for file in site.rglob("*.html"))
    print(f"{label}: load {load:.2f} s for {loaded} run folder(s) (baseline)")
    print(f"  view build {build:.2f} s  ({build / load:.1f}x load), site {size / 1e6:.1f} MB of HTML")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="reroll-bench-view-") as tmp:
        for number, (label, folder) in enumerate(workloads(Path(tmp), __doc__)):
            measure(label, folder, Path(tmp) / f"site{number}")


if __name__ == "__main__":
    main()
