"""``reroll view`` in a real headless Chromium: a run recorded, continued (with a divergence) and
branched by the real `reroll` executable with the bundled scripted model, and a job table.

The browser is Debian's ``chromium`` driven through Debian's ``chromedriver`` by Selenium: the
driver's path is given, so Selenium Manager never looks for one on the network, and the driver
always matches the browser (both come from the same Debian source package). When they are
missing they are installed with apt-get; the tests skip, with the reason, when that fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from reroll.view import build_site
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.select import Select

from tests.export.conftest import chat_exchanges, write_run, write_side
from tests.jobs.test_branch import URLLIB_AGENTS

REROLL = str(Path(sys.executable).parent / "reroll")
TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WINDOW = (1280, 800)
"""A laptop screen, in CSS pixels."""
SCREENSHOTS = "REROLL_VIEW_SCREENSHOTS"
"""Folder for the screenshots [default: the test's temporary folder]; docs/ holds the site's."""
pytestmark = [pytest.mark.slow, pytest.mark.spawns]


@pytest.fixture(scope="session")
def chromium() -> tuple[Path, Path]:
    """Debian's chromium and chromedriver, installed with apt-get when missing."""
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            pytest.skip("chromium and chromium-driver are not installed and apt-get cannot install them")
        apt = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
        for command in (["apt-get", "update"], install):
            done = subprocess.run(command, capture_output=True, text=True, env=apt, timeout=900)
            if done.returncode != 0:
                pytest.skip(f"{' '.join(command)} failed: {done.stderr.strip()[-300:]}")
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture(scope="module")
def browser(chromium: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """One headless Chromium for the module's tests; its profile, configuration and crash reports
    in a temporary folder, not in HOME (tests/sandbox/local/test_isolated.py watches HOME)."""
    binary, driver = chromium
    home = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    options.add_argument(f"--user-data-dir={home / 'profile'}")
    env = {**os.environ, "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache")}
    chrome = webdriver.Chrome(service=Service(executable_path=str(driver), env=env), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def reroll(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """`reroll ARGS` started in `cwd`, with the test agent's registry (cwd/agents.yaml)."""
    env = {**os.environ, "REROLL_AGENTS_FILE": str(cwd / "agents.yaml")}
    return subprocess.Popen(
        [REROLL, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finished(process: subprocess.Popen[str]) -> None:
    output, _ = process.communicate(timeout=900)
    print(output)
    assert process.returncode == 0, output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A recorded run of a urllib Chat Completions agent (reward 1); its continuation from step 3
    of a copy whose observation at step 1 was changed (a divergence); a branch tree from step 2
    with two models (the bundled script, reward 1; its wrong-fix variant, reward 0)."""
    workdir = tmp_path_factory.mktemp("view-main-job")
    (workdir / "agents.yaml").write_text(yaml.safe_dump(URLLIB_AGENTS))
    script = yaml.safe_load((TASK / "scripted-model.yaml").read_text())
    for turn in script["turns"]:
        turn.pop("delay_seconds", None)
    (workdir / "fast.yaml").write_text(yaml.safe_dump(script))
    fast, wrong = f"scripted:{workdir / 'fast.yaml'}", f"scripted:{TASK / 'scripted-model-wrong-fix.yaml'}"
    recording = reroll(
        "run", str(TASK), "--agent", "urllib-chat", "--model", fast, "--sandbox", "local",
        "--jobs-dir", "jobs", "--job-name", "record", cwd=workdir,
    )  # fmt: skip
    finished(recording)
    (recorded,) = (workdir / "jobs" / "record").iterdir()
    tampered = workdir / "tampered" / recorded.name
    shutil.copytree(recorded, tampered)
    trajectory = tampered / "trajectory" / "llm_trajectory.jsonl"
    lines = [orjson.loads(line) for line in trajectory.read_bytes().splitlines()]
    observation = next(m for m in reversed(lines[1]["request"]["body"]["messages"]) if m["role"] == "tool")
    observation["content"] = observation["content"].replace("def mean", "def median")
    trajectory.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    continuing = reroll("continue", str(tampered), "--at", "3", "--output", "continued", cwd=workdir)
    branching = reroll(
        "branch", str(recorded), "--at", "2", "--model", fast, "--model", wrong, "--output", "tree",
        cwd=workdir,
    )  # fmt: skip
    finished(continuing)
    finished(branching)
    (continued,) = (workdir / "continued").iterdir()
    (tree,) = (workdir / "tree").iterdir()
    return {"continued": continued, "tree": tree}


def click(browser: WebDriver, element: WebElement) -> None:
    """Click `element` once scrolled to the middle of the window (not under the sticky header)."""
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(SCREENSHOTS) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    print("screenshots:", folder)
    return folder


def view(path: Path, output: Path) -> str:
    """The URL of the site of `path` (built in this process: `reroll view` itself is tested in
    tests/view/test_site.py)."""
    return build_site(path, output).as_uri()


def test_a_continued_run_shows_its_cutover_and_divergence(
    browser: WebDriver, runs: dict[str, Path], tmp_path: Path
) -> None:
    browser.get(view(runs["continued"], tmp_path / "site"))
    assert browser.find_element(By.ID, "status").text == "ok"
    assert browser.find_element(By.ID, "reward").text == "1.000"
    cutover = browser.find_element(By.ID, "cutover")
    assert cutover.get_attribute("data-step") == "3"
    turns = browser.find_elements(By.CSS_SELECTOR, "article.turn")
    steps = [
        (int(t.get_attribute("data-step") or -1), "replayed" in (t.get_attribute("class") or ""))
        for t in turns
    ]
    assert all(replayed == (step < 3) for step, replayed in steps)
    before = browser.execute_script("return arguments[0].previousElementSibling.dataset.step", cutover)
    after = browser.execute_script("return arguments[0].nextElementSibling.dataset.step", cutover)
    assert (before, after) == ("2", "3")
    click(browser, browser.find_element(By.LINK_TEXT, "Divergences (1)"))
    (divergence,) = browser.find_elements(By.CSS_SELECTOR, "#divergences ~ .divergence")
    assert divergence.get_attribute("data-step") == "1"
    field = divergence.find_element(By.CSS_SELECTOR, "code.field").text
    assert field.startswith("messages[") and "observation_changed" in divergence.text
    assert any(
        "median" in span.text
        for span in divergence.find_elements(By.CSS_SELECTOR, "pre.diff span.del, pre.diff span.add")
    )
    click(browser, browser.find_element(By.LINK_TEXT, "jump to the cutover"))
    browser.save_screenshot(str(screenshots(tmp_path) / "view-run.png"))
    click(browser, browser.find_element(By.ID, "hide-replayed"))
    assert not any(t.is_displayed() for t in turns if "replayed" in (t.get_attribute("class") or ""))
    assert browser.execute_script("return document.documentElement.scrollWidth") <= WINDOW[0]


def test_a_branch_tree_shows_rewards_and_links_each_branch(
    browser: WebDriver, runs: dict[str, Path], tmp_path: Path
) -> None:
    browser.get(view(runs["tree"], tmp_path / "site"))
    rewards = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".node.child .reward")]
    means = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".node.model .mean-reward")]
    assert rewards == ["1.000", "0.000"] and means == ["1.000", "0.000"]
    browser.find_element(By.TAG_NAME, "main").screenshot(str(screenshots(tmp_path) / "view-tree.png"))
    click(browser, browser.find_elements(By.CSS_SELECTOR, ".node.child a")[1])
    assert browser.find_element(By.ID, "reward").text == "0.000"
    assert browser.find_element(By.ID, "cutover").get_attribute("data-step") == "2"
    click(browser, browser.find_element(By.ID, "provenance-link"))
    assert browser.current_url.endswith("/runs/prefix.html")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#exchange-table tbody tr")) == 2
    assert browser.execute_script("return document.documentElement.scrollWidth") <= WINDOW[0]


def test_a_job_table_sorts_and_filters(browser: WebDriver, tmp_path: Path) -> None:
    job = tmp_path / "job"
    for name, reward, status in [("b", 0.0, "ok"), ("a", 1.0, "timeout"), ("c", 0.5, "ok")]:
        write_run(job / name, chat_exchanges(), result={"rewards": {"reward": reward}, "status": status})
    browser.get(view(job, tmp_path / "site"))

    def names() -> list[str]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr")
        return [row.find_element(By.TAG_NAME, "a").text for row in rows if row.is_displayed()]

    assert names() == ["a", "b", "c"]
    reward_header = browser.find_element(By.XPATH, "//table[@id='rollouts']//th[text()='reward']")
    click(browser, reward_header)
    assert names() == ["b", "c", "a"]
    click(browser, reward_header)
    assert names() == ["a", "c", "b"]
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("ok")
    assert names() == ["c", "b"] and browser.find_element(By.ID, "shown").text == "2"
    browser.find_element(By.ID, "filter").send_keys("c")
    assert names() == ["c"]
    click(browser, browser.find_element(By.LINK_TEXT, "c"))
    assert browser.current_url.endswith("/runs/c.html")
    assert browser.find_element(By.ID, "reward").text == "0.500"


def test_the_persona_users_section_is_reached_from_the_menu(browser: WebDriver, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    write_side(run, "user", "The agent asks: which file holds add?", "math.py", replayed=True)
    write_side(run, "judge", "Grade this diff.", '{"reward": 1}')
    browser.get(view(run, tmp_path / "site"))
    click(browser, browser.find_element(By.LINK_TEXT, "Persona (1)"))
    section = browser.find_element(By.ID, "side-user")
    answer = section.find_element(By.CSS_SELECTOR, "article.turn.agent")
    assert answer.is_displayed() and answer.text.splitlines()[-1] == "math.py"
    assert browser.execute_script("return arguments[0].getBoundingClientRect().top", answer) < WINDOW[1]
    click(browser, section.find_element(By.LINK_TEXT, "step 0"))
    assert browser.current_url.endswith("#user-exchange-0")
    row = browser.find_element(By.ID, "user-exchange-0")
    assert "user-model" in row.text and "replayed" in row.text
    judged = browser.find_element(By.ID, "side-judge").find_elements(By.CSS_SELECTOR, "article.turn")
    assert [turn.text.splitlines()[-1] for turn in judged] == ["Grade this diff.", '{"reward": 1}']
    click(browser, browser.find_element(By.ID, "hide-replayed"))
    assert not answer.is_displayed()
    assert browser.execute_script("return document.documentElement.scrollWidth") <= WINDOW[0]
