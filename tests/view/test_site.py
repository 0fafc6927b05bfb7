"""`reroll view`, in process: what a run's, a job's and a tree's pages show, and clear errors for
corrupt run folders and unwritable sites."""

from __future__ import annotations

import os
import re
from pathlib import Path

import orjson
import pytest
from reroll.cli.app import app
from reroll.view import build_site
from reroll.view.runpage import MAX_FILE_BYTES
from reroll_contracts.errors import RunFolderError, TrajectoryFormatError, ViewError
from typer.testing import CliRunner

from tests.export.conftest import (
    GRADED,
    WEIGHTED_RESULT,
    chat_exchanges,
    in_format,
    write_run,
    write_side,
    write_tree,
)

DIVERGENCE = {
    "message_index": 3,
    "field": "messages[3].content[0].content[0].text",
    "classification": "observation_changed",
    "summary": "tool message 3 differs: 'def test_add' -> 'def test_sub'",
    "diff": "--- recorded\n+++ live\n@@ -1 +1 @@\n-def test_add(): assert add(1, 2) == 3\n+def test_sub(): 1",
}
FAULT = {"rule": "rate-limit", "spec": {"kind": "status", "status_code": 429}}


def continued_run(folder: Path, api_format: str = "openai-chat") -> Path:
    """A continuation of `chat_exchanges`: two exchanges replayed (the second divergent), then
    a 429 injected by a fault plan, then the live model's two answers."""
    pairs = in_format(api_format)
    provenance = {
        "path": "/runs/original",
        "status": "timeout",
        "cut_index": 2,
        "original_model": "gpt-old",
        "live_model": "gpt-test",
    }
    write_run(folder, pairs, api_format=api_format, replayed=2, config={"continued_from": provenance})
    trajectory = folder / "trajectory" / "llm_trajectory.jsonl"
    lines = [orjson.loads(line) for line in trajectory.read_bytes().splitlines()]
    lines[1]["metadata"]["divergence"] = DIVERGENCE
    fault = orjson.loads(orjson.dumps(lines[2]))
    fault["response"] = {"timestamp": fault["request"]["timestamp"], "status_code": 429, "body": None}
    fault["metadata"] |= {"fault": FAULT, "ttfb_ms": 1.0}
    lines.insert(2, fault)
    trajectory.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    (folder / "verifier").mkdir()
    (folder / "verifier" / "test-stdout.txt").write_text("Ran 2 tests\nOK\n")
    return folder


def test_a_continued_run_shows_cutover_divergence_and_fault(tmp_path: Path) -> None:
    run = continued_run(tmp_path / "run")
    index = build_site(run)
    assert index == run / "view" / "index.html"
    page = index.read_text()
    # The cutover marker sits before the first live answer: step 3 (step 2 is the injected 429).
    assert re.search(r'id="cutover" data-step="3"', page)
    assert page.index('id="cutover"') < page.index('id="step-3"')
    assert page.index('id="step-1"') < page.index('id="cutover"')
    assert "messages[3].content[0].content[0].text" in page and "observation_changed" in page
    assert '<span class="add">+def test_sub(): 1</span>' in page
    assert 'class="fault-row" data-step="2"' in page and "rate-limit" in page
    # The 429 is shown in the conversation too, before the answer that followed it.
    assert (
        page.index('id="step-1"')
        < page.index('class="failed-call" data-step="2"')
        < page.index('id="step-3"')
    )
    assert 'href="file:///runs/original/"' in page and "Continued" in page
    assert "sed -i" in page and "Ran 2 tests" in page
    assert "cutover: live from step 2" in page  # the exchange timeline: the cut is after 2 exchanges
    assert "<script" in page and "http://" not in page and "https://" not in page


@pytest.mark.parametrize("api_format", ["openai-responses", "anthropic-messages"])
def test_every_wire_format_gives_the_same_conversation(tmp_path: Path, api_format: str) -> None:
    def conversation(page: str) -> list[str]:
        return re.findall(r'<pre class="(?:text|cmd)">(.*?)</pre>', page, re.S)

    chat = build_site(continued_run(tmp_path / "chat")).read_text()
    other = build_site(continued_run(tmp_path / "other", api_format)).read_text()
    assert conversation(chat) == conversation(other)
    assert len(conversation(chat)) == 7  # the task, 3 answers, 2 commands... and the system prompt


def test_text_from_the_agent_is_escaped(tmp_path: Path) -> None:
    pairs = chat_exchanges()
    pairs[0][1]["choices"][0]["message"]["content"] = "<script>alert(1)</script>"
    page = build_site(write_run(tmp_path / "run", pairs)).read_text()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_job_table_links_every_run(tmp_path: Path) -> None:
    job = tmp_path / "job"
    for name, reward in [("b", 0.0), ("a", 1.0), ("c", 0.5)]:
        write_run(job / name, chat_exchanges(), result={"rewards": {"reward": reward}})
    (job / "continued").mkdir()
    index = build_site(job, tmp_path / "site")
    page = index.read_text()
    assert re.findall(r'<a href="(runs/[^"]+)">', page) == ["runs/a.html", "runs/b.html", "runs/c.html"]
    assert 'data-value="0.5"' in page and "0.500 (3 scored)" in page
    assert sorted(p.name for p in (tmp_path / "site" / "runs").iterdir()) == ["a.html", "b.html", "c.html"]
    assert 'href="../index.html"' in (tmp_path / "site" / "runs" / "a.html").read_text()


def test_a_job_with_a_linked_run_folder_gets_its_page(tmp_path: Path) -> None:
    write_run(tmp_path / "elsewhere", chat_exchanges())
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "linked").symlink_to(tmp_path / "elsewhere")
    page = build_site(tmp_path / "job", tmp_path / "site").read_text()
    assert '<a href="runs/linked.html">linked</a>' in page
    assert (tmp_path / "site" / "runs" / "linked.html").is_file()


def test_a_branch_tree_shows_each_reward_and_the_mean_per_model(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree", [1.0, 0.0])
    page = build_site(tree, tmp_path / "site").read_text()
    assert re.findall(r'reward">([0-9.]+)</span>', page) == ["1.000", "0.000"]
    assert '<b class="mean-reward">0.500</b>' in page
    child = (tmp_path / "site" / "runs" / "gpt-test__0.html").read_text()
    assert 'id="provenance-link">' in child and 'href="prefix.html"' in child  # branched from: the parent
    assert (tmp_path / "site" / "runs" / "prefix.html").is_file()


def test_a_branch_tree_shows_the_mean_of_each_graded_item_per_model(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree", [1.0, 0.0])
    assert 'id="item-means"' not in build_site(tree, tmp_path / "plain").read_text()  # no graded reward
    summary = orjson.loads((tree / "summary.json").read_bytes())
    summary["models"][0]["item_means"] = {"tests": 0.5, "docs": 1.0}
    (tree / "summary.json").write_bytes(orjson.dumps(summary))
    page = build_site(tree, tmp_path / "site").read_text()
    table = page.split('id="item-means"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<td>gpt-test</td><td>(\w+)</td><td[^>]*>([0-9.]+)</td>", table) == [
        ("tests", "0.500"),
        ("docs", "1.000"),
    ]


def test_a_truncated_config_is_named(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    config = run / "config.json"
    config.write_bytes(config.read_bytes()[:20])
    with pytest.raises(RunFolderError, match=re.escape(f"{config}: invalid JSON")):
        build_site(run)


def test_a_corrupt_trajectory_line_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    job = tmp_path / "job"
    write_run(job / "a", chat_exchanges())
    trajectory = write_run(job / "b", chat_exchanges()) / "trajectory" / "llm_trajectory.jsonl"
    first, *rest = trajectory.read_bytes().splitlines(keepends=True)
    trajectory.write_bytes(first + b'{"request": {}}\n' + b"".join(rest))
    with pytest.raises(TrajectoryFormatError):
        build_site(job)
    done = CliRunner().invoke(app, ["view", str(job)])
    assert done.exit_code == 2
    assert f"{trajectory}: line 2: not an exchange" in " ".join(done.stderr.split())


def test_a_truncated_last_line_is_shown_as_a_note(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    trajectory = run / "trajectory" / "llm_trajectory.jsonl"
    trajectory.write_bytes(trajectory.read_bytes() + b'{"request": {"timest')
    page = build_site(run).read_text()
    assert "line 4 is truncated" in page


def test_a_folder_that_is_no_run_is_refused(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert done.exit_code == 2 and "not a run folder" in done.stderr


def test_an_unwritable_output_is_a_view_error(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    (tmp_path / "file").write_text("")
    with pytest.raises(ViewError, match=re.escape(str(tmp_path / "file"))):
        build_site(run, tmp_path / "file")


def test_verifier_links_and_fifos_are_not_followed(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    verifier = run / "verifier"
    verifier.mkdir()
    (tmp_path / "secret").write_text("SECRET-OUTSIDE")
    (verifier / "link.txt").symlink_to(tmp_path / "secret")
    os.mkfifo(verifier / "fifo.txt")
    (verifier / "big.txt").write_text("x" * MAX_FILE_BYTES + "THE-END")
    page = CliRunner().invoke(app, ["view", str(run)])
    assert page.exit_code == 0, page.output
    html = (run / "view" / "index.html").read_text()
    assert "SECRET-OUTSIDE" not in html and "fifo.txt" not in html
    assert "THE-END" in html and "7 bytes before left out" in html


def test_open_hands_the_index_to_the_browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    run = write_run(tmp_path / "run", chat_exchanges())
    done = CliRunner().invoke(app, ["view", str(run), "--output", str(tmp_path / "site"), "--open"])
    assert done.exit_code == 0, done.output
    assert opened == [(tmp_path / "site" / "index.html").as_uri()]


def test_a_relative_provenance_path_is_shown_without_a_link(tmp_path: Path) -> None:
    provenance = {"path": "elsewhere/run", "status": "timeout", "cut_index": 1, "original_model": None,
                  "live_model": None}  # fmt: skip
    run = write_run(tmp_path / "run", chat_exchanges(), replayed=1, config={"continued_from": provenance})
    page = build_site(run).read_text()
    assert "<code>elsewhere/run</code>" in page and 'id="provenance-link"' not in page


def test_a_graded_reward_shows_its_events_linked_to_their_steps(tmp_path: Path) -> None:
    graded = {**GRADED, "events": [*GRADED["events"], {"source": "<b>x</b>", "reward": 0.0}]}
    result = {"rewards": {"reward": 0.5, "ran-tests": 1.0, "no-edits-to-tests": 0.0}, "verify_result": graded}
    page = build_site(write_run(tmp_path / "run", chat_exchanges(), result=result)).read_text()
    events = page.split('id="reward-events"', 1)[1].split("</table>", 1)[0]
    assert '<a href="#exchange-1">1</a>' in events and "no-edits-to-tests" in events
    assert "&lt;b&gt;x&lt;/b&gt;" in events  # a verifier's text is escaped too
    assert "space output, granularity terminal" in page


def test_a_weighted_reward_shows_its_method_items_and_weights(tmp_path: Path) -> None:
    page = build_site(write_run(tmp_path / "run", chat_exchanges(), result=WEIGHTED_RESULT)).read_text()
    assert re.search(r"Aggregate: <b>weighted_mean</b> of 4 items = <b>0\.400</b>", page)
    items = page.split('id="reward-items"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(
        r'<tr><td>(\w+)</td><td class="num">([0-9.]+)</td><td class="num">([0-9.]+)</td></tr>', items
    )
    assert rows == [("tests", "1.000", "0.300"), ("lint", "0.000", "0.300"), ("docs", "1.000", "0.100"),
                    ("style", "0.000", "0.300")]  # fmt: skip


def test_the_persona_and_judge_conversations_get_their_own_sections(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    write_side(run, "user", "The agent asks: which file?", "math.py <b>now</b>", replayed=True)
    write_side(run, "judge", "Grade this diff.", '{"reward": 1}')
    side = run / "trajectory" / "user_trajectory.jsonl"
    side.write_bytes(side.read_bytes() + b'{"request": {"timest')
    page = build_site(run).read_text()
    assert '<a href="#side-judge">Judge (1)</a>' in page and '<a href="#side-user">Persona (1)</a>' in page
    persona = page[page.index('<section class="side" id="side-user">') :]
    persona = persona[: persona.index('<h2 id="verifier">')]
    assert "The agent asks: which file?" in persona and "math.py &lt;b&gt;now&lt;/b&gt;" in persona
    assert 'id="user-step-0"' in persona and 'href="#user-exchange-0"' in persona
    assert '<tr id="user-exchange-0" class="replayed">' in persona
    assert f"{side}: line 2 is truncated" in persona
    assert "{&#34;reward&#34;: 1}" in page[page.index('id="side-judge"') :]
    ids = re.findall(r' id="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "an anchor of a side trajectory collides with the agent's"


def test_a_corrupt_judge_trajectory_exits_2_naming_the_file(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    write_side(run, "judge", "Grade this diff.", "1")
    side = run / "trajectory" / "judge_trajectory.jsonl"
    side.write_bytes(b"not json\n" + side.read_bytes())
    done = CliRunner().invoke(app, ["view", str(run)])
    assert done.exit_code == 2
    assert f"{side}: line 1" in " ".join(done.stderr.split())


def test_a_run_without_mcp_says_which_servers_it_was_not_offered(tmp_path: Path) -> None:
    """``reroll run --without-mcp`` (a baseline on an MCP task): the page names the servers withheld."""
    run = write_run(
        tmp_path / "run",
        chat_exchanges(),
        config={"without_mcp": True},
        result={"status": "ok", "rewards": {"reward": 0.0}, "mcp_withheld": ["mail"]},
    )
    page = build_site(run).read_text()
    assert re.search(r'id="without-mcp">--without-mcp: the task.s servers mail not offered', page)
    assert 'id="without-mcp"' not in build_site(write_run(tmp_path / "plain", chat_exchanges())).read_text()
