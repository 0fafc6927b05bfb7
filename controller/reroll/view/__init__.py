"""``reroll view PATH [--output DIR] [--open]``: a static, self-contained HTML site of a run
folder, a job folder or a branch tree (no server; CSS and JavaScript inlined, nothing fetched).

The site, in DIR [default: ``PATH/view``]::

    index.html           a run: its page; a job: the table of its rollouts (sorts and filters)
                         and, for a sequential-shared job, its learner store's generations;
                         a branch tree: the tree, each child's reward, the mean reward per model
    runs/<folder>.html   a job's or a tree's run pages (a tree's shared prefix: runs/prefix.html)

A run's page (`reroll.view.runpage`): the conversation as the agent saw it (the turns
`reroll.runfolder.conversation` builds from every wire format), replayed and live steps, the
cutover marker before the live model's first answer, each divergence with its field and diff,
injected faults, the timeline of exchanges (start, duration, time to first byte, tokens) and of
the agent's commands, the verifier's files and rewards, the agent's log, and provenance links
(continued from / branched from: to the page of that run when it is in the site, else to its
folder). Run folders are read with `reroll.runfolder.run.load_run_folder`, one at a time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from jinja2 import Environment, PackageLoader, StrictUndefined
from reroll_contracts.errors import ExportError, RunFolderError, ViewError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from reroll.runfolder.folders import job_run_folders, kind_of
from reroll.runfolder.run import RunFolder, load_run_folder
from reroll.runfolder.store import Rollback, load_head, store_of, summarise_store
from reroll.runfolder.summary import BranchSummary, GenerationSummary, read_tree_summary
from reroll.view.runpage import RunView, calls_and_results, command_text, run_view

PREFIX_PAGE = "prefix.html"
"""A branch tree's shared prefix (the parent folder), in ``runs/``."""


@dataclass
class RolloutRow:
    """One rollout in a job's table or a branch tree."""

    name: str
    href: str
    """Its page, relative to index.html."""
    task: str
    agent: str
    model: str | None
    status: str
    reward: float | None
    exchanges: int
    replayed: int
    divergences: int
    faults: int
    tokens: int
    seconds: float | None
    """The rollout's wall-clock time (result.json's ``timings.total_seconds``)."""


def build_site(path: Path, output: Path | None = None, *, console: Console | None = None) -> Path:
    """Write the site of the run folder, job folder or branch tree `path` (see the module docstring).

    Args:
        path: a run folder, a job folder or a branch tree (``reroll branch``'s output).
        output: the site's folder [default: ``path/view``]; created if missing, pages replaced.
        console: where the progress bar of a job's or tree's pages goes [default: none shown].

    Returns:
        The site's index.html.

    Raises:
        ExportError: a trajectory names an unknown API format.
        RunFolderError: `path` is not a run, job or tree folder, or a job holds no run folder (the
            message names it); a run folder lacks a file or one is corrupt (the message names the
            file, and the line for a trajectory).
        ViewError: the output folder cannot be created or written.
    """
    path = path.resolve()
    kind = kind_of(path)
    output = (output if output is not None else path / "view").resolve()
    writer = _Writer(output)
    if kind == "run":
        run = load_run_folder(path, sides=True)
        writer.write("index.html", _render_run(_view(run), home="index.html", link=_folder_link))
    elif kind == "job":
        folders = job_run_folders(path)
        if not folders:
            raise RunFolderError(f"{path}: a job folder without run folders")
        rows = _build_runs(writer, folders, console, label=f"job {path.name}")
        store, rollbacks = _store_of(path)
        page = _env().get_template("job.html.j2")
        pages = {row.name: row.href for row in rows}
        html = page.render(
            job=path, rows=rows, home="index.html", store=store, rollbacks=rollbacks, pages=pages
        )
        writer.write("index.html", html)
    else:
        summary = read_tree_summary(path)
        assert summary is not None
        writer.write("index.html", _build_tree(writer, path, summary, console))
    return output / "index.html"


def _store_of(job: Path) -> tuple[list[GenerationSummary] | None, list[Rollback]]:
    """A sequential-shared job's learner store: its generations and rollbacks; (None, []) when it has none.

    Raises:
        StoreError: the store exists but a file of it is corrupt (the message names it).
    """
    store = store_of(job)
    if not store.exists():
        return None, []
    return summarise_store(store), load_head(store).rollbacks


def _build_tree(writer: _Writer, path: Path, summary: BranchSummary, console: Console | None) -> str:
    folders = [path / child.folder for child in summary.children]
    pages = {str(path): PREFIX_PAGE} | {str(folder): f"{folder.name}.html" for folder in folders}
    prefix = _view(load_run_folder(path, sides=True))
    link = _site_link(pages)
    writer.write(f"runs/{PREFIX_PAGE}", _render_run(prefix, home="../index.html", link=link))
    rows = _build_runs(writer, folders, console, label=f"branches of {path.name}", pages=pages)
    return (
        _env()
        .get_template("tree.html.j2")
        .render(
            summary=summary,
            prefix=_row(prefix, path.name, f"runs/{PREFIX_PAGE}"),
            children=list(zip(summary.children, rows, strict=True)),
            original=_folder_link(summary.original),
            home="index.html",
        )
    )


def _build_runs(
    writer: _Writer,
    folders: list[Path],
    console: Console | None,
    *,
    label: str,
    pages: dict[str, str] | None = None,
) -> list[RolloutRow]:
    """Write ``runs/<folder>.html`` for each folder (one loaded at a time), with a progress bar."""
    pages = pages or {str(folder): f"{folder.name}.html" for folder in folders}
    link = _site_link(pages)
    rows: list[RolloutRow] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=console is None,
        transient=False,
    ) as progress:
        task = progress.add_task(f"view: {label}", total=len(folders))
        for folder in folders:
            view = _view(load_run_folder(folder, sides=True))
            page = pages[str(folder)]
            writer.write(f"runs/{page}", _render_run(view, home="../index.html", link=link))
            rows.append(_row(view, folder.name, f"runs/{page}"))
            progress.advance(task)
    return rows


def _view(run: RunFolder) -> RunView:
    try:
        return run_view(run)
    except KeyError as exc:
        raise ExportError(f"{run.path}: {exc.args[0]}") from exc


def _row(view: RunView, name: str, href: str) -> RolloutRow:
    run = view.run
    return RolloutRow(
        name=name,
        href=href,
        task=run.config.task_name or Path(run.config.task_path).name,
        agent=run.config.agent,
        model=run.config.model,
        status=view.status,
        reward=view.reward,
        exchanges=len(view.exchanges),
        replayed=sum(1 for row in view.exchanges if row.source == "replayed"),
        divergences=len(view.divergent),
        faults=len(view.faulted),
        tokens=sum(row.tokens or 0 for row in view.exchanges),
        seconds=run.result.timings.total_seconds if run.result is not None else None,
    )


def _render_run(view: RunView, *, home: str, link: Callable[[str], str | None]) -> str:
    return _env().get_template("run.html.j2").render(view=view, home=home, link=link)


def _folder_link(folder: str) -> str | None:
    """A link to a run folder outside the site: its ``file://`` URL; None for a relative path
    (a file written elsewhere: nothing says what it is relative to)."""
    path = Path(folder)
    return path.as_uri() + "/" if path.is_absolute() else None


def _site_link(pages: dict[str, str]) -> Callable[[str], str | None]:
    """Links from one run page to another: a sibling page when the run is in the site."""
    return lambda folder: pages.get(folder) or _folder_link(folder)


class _Writer:
    """Writes the site's files under `root`, converting OS errors to `ViewError`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, name: str, text: str) -> None:
        file = self.root / name
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            tmp = file.with_name(f".{file.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, file)
        except OSError as exc:
            raise ViewError(f"{file}: cannot write the site ({exc.strerror or exc})") from exc


@functools.cache
def _env() -> Environment:
    """The templates (package data of reroll.view), autoescaped."""
    env = Environment(
        loader=PackageLoader("reroll.view", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(command_text=command_text, calls_and_results=calls_and_results, diff_class=_diff_class)
    env.filters.update(reward=_reward, seconds=_seconds, json=_json)
    return env


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "head"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")


def _reward(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
