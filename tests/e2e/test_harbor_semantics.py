"""Harbor-layout tasks run as Harbor runs them (issue 29), on docker with the oracle.

One honest task checks, in one rollout: the image's ``ENV`` (PATH, PYTHONPATH, a variable of its
own) in the oracle and in ``test.sh``; ``test.sh`` run from the image's ``WORKDIR``; the pytest
configuration shipped with the tests read (not ``-c /dev/null``, rootdir not ``/dev``); a
``test.sh`` that passes pytest its own ``--junitxml`` scored by its reward file; the task's
``/logs/verifier`` kept whole in the run folder; ``version`` beside ``schema_version`` accepted; a
server the solution left running still up for the tests, as Harbor keeps it.
Two more show that a verifier that could not run is an error naming why, never ``ok 0.0``, and
one that the oracle keeps the task's skills its Dockerfile copies (as BenchFlow deploys them for
its oracle) under the default ``--skills no-skill``. The attack that keeping the agent's
processes invites (one that swaps the hidden tests a ``test.sh`` copies into the workspace) fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_reward_hacks import run_oracle, write_files

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]

TASK_TOML = """version = "1.0"
schema_version = "1.1"

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = 120.0

[environment]
allow_internet = false
"""
DOCKERFILE = """FROM reroll/base:bookworm
RUN mkdir -p /opt/tool/bin /opt/lib /srv/work \\
 && printf '#!/bin/sh\\necho tool-ok\\n' > /opt/tool/bin/harbor-tool && chmod +x /opt/tool/bin/harbor-tool \\
 && printf 'VALUE = 42\\n' > /opt/lib/eigen.py
ENV PATH=/opt/tool/bin:$PATH PYTHONPATH=/opt/lib MARKER=from-image
WORKDIR /srv/work
"""
SERVER = (
    "import socketserver as s; s.TCPServer(('127.0.0.1', 5328), type('H', (s.StreamRequestHandler,),"
    " {'handle': lambda self: self.wfile.write(b'pong')})).serve_forever()"
)
SOLVE_SH = f"""#!/bin/sh
set -e
harbor-tool > answer.txt
echo "$MARKER" >> answer.txt
python3 -c 'import eigen; print(eigen.VALUE)' >> answer.txt
nohup python3 -c "{SERVER}" > /dev/null 2>&1 &
"""
HONEST_TEST_SH = """#!/bin/sh
mkdir -p /logs/verifier
echo "cwd $(pwd)"
python3 -m pytest --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py -rA \\
  > /logs/verifier/pytest.log 2>&1
status=$?
cat /logs/verifier/pytest.log
if [ "$status" -eq 0 ] && [ "$(pwd)" = /srv/work ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
PYTEST_INI = "[pytest]\nmarkers =\n    harbor: declared only by the tests' own pytest.ini\n"
TEST_OUTPUTS = """import os
import eigen
import pytest


@pytest.mark.harbor
def test_answer():
    with open("/srv/work/answer.txt") as answer:
        assert answer.read().split() == ["tool-ok", "from-image", "42"]


def test_the_server_the_solution_left_running():
    import socket
    with socket.create_connection(("127.0.0.1", 5328), timeout=10) as connection:
        assert connection.recv(4) == b"pong"


def test_the_image_env_and_the_shipped_ini(pytestconfig):
    assert os.environ["MARKER"] == "from-image" and eigen.VALUE == 42
    assert str(pytestconfig.inipath) == "/tests/pytest.ini"
    assert any(line.startswith("harbor:") for line in pytestconfig.getini("markers"))
"""
MISSING_UVX_TEST_SH = """#!/bin/sh
mkdir -p /logs/verifier
if uvx -p 3.11 -w pytest==8.4.1 pytest /tests/test_outputs.py; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
OFFLINE_TEST_SH = """#!/bin/sh
mkdir -p /logs/verifier
if python3 -c "import urllib.request as u; u.urlopen('https://pypi.org/simple/pytest/', timeout=20)" \\
   && python3 -m pytest /tests/test_outputs.py; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def harbor_task(root: Path, name: str, test_sh: str) -> Path:
    """A Harbor-layout task under `root` whose ``tests/test.sh`` is `test_sh`."""
    return write_files(
        root / name,
        {
            "task.toml": TASK_TOML,
            "instruction.md": "Write answer.txt with the image's tool.\n",
            "environment/Dockerfile": DOCKERFILE,
            "solution/solve.sh": SOLVE_SH,
            "tests/test.sh": test_sh,
            "tests/pytest.ini": PYTEST_INI,
            "tests/test_outputs.py": TEST_OUTPUTS,
        },
    )


def test_an_honest_harbor_task_scores_as_harbor_scores_it(tmp_path: Path) -> None:
    result, run_dir = run_oracle(harbor_task(tmp_path, "honest", HONEST_TEST_SH), tmp_path)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
    verifier = run_dir / "verifier"
    stdout = (verifier / "test-stdout.txt").read_text()
    assert "cwd /srv/work" in stdout and "3 passed" in stdout, stdout
    # the task's own files of /logs/verifier, kept whole; its test ids name their file
    assert 'classname="test_outputs"' in (verifier / "junit.xml").read_text()
    assert "3 passed" in (verifier / "pytest.log").read_text()


SCORE_TEST_SH = """#!/bin/sh
# Harbor's score-based form: the reward is the share of tests passed, pytest's status ignored.
mkdir -p /logs/verifier
python3 -m pytest /tests/test_outputs.py /tests/test_bonus.py -rA > /tmp/pytest.out 2>&1
passed=$(grep -c '^PASSED' /tmp/pytest.out); failed=$(grep -c '^FAILED' /tmp/pytest.out)
python3 -c "print($passed / ($passed + $failed))" > /logs/verifier/reward.txt
"""


def test_a_score_based_test_sh_scores_its_share_of_tests_passed(tmp_path: Path) -> None:
    """Three of four tests pass: the reward file says 0.75, as Harbor scores it; reroll's own
    pytest report caps rewards at that share and keeps it (issue 29, defect 8: zeroed before)."""
    task = harbor_task(tmp_path, "score", SCORE_TEST_SH)
    (task / "tests" / "test_bonus.py").write_text("def test_bonus():\n    assert False\n")
    result, run_dir = run_oracle(task, tmp_path)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 0.75}), result
    assert "rewards zeroed above 0.75" in (run_dir / "verifier" / "pytest-report.txt").read_text()


@pytest.mark.parametrize(
    ("name", "test_sh", "category", "named"),
    [
        ("missing-uvx", MISSING_UVX_TEST_SH, "verifier_error", "`uvx`"),
        ("offline", OFFLINE_TEST_SH, "needs_internet", "internet"),
    ],
)
def test_a_verifier_that_could_not_run_is_an_error_naming_why(
    name: str, test_sh: str, category: str, named: str, tmp_path: Path
) -> None:
    result, _ = run_oracle(harbor_task(tmp_path, name, test_sh), tmp_path)
    assert (result["status"], result["error_category"]) == ("error", category), result
    assert named in result["error"], result["error"]


SKILLS_DOCKERFILE = "FROM reroll/base:bookworm\nCOPY skills /opt/skills\nWORKDIR /app\n"
SKILLS_SOLVE_SH = "#!/bin/sh\nset -e\nsh /opt/skills/greeter/scripts/greet.sh > /app/greeting.txt\n"
SKILLS_TEST_SH = """#!/bin/sh
mkdir -p /logs/verifier
if [ "$(cat /app/greeting.txt)" = "hello from a skill" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_the_oracle_keeps_the_skills_its_dockerfile_copies(tmp_path: Path) -> None:
    task = write_files(
        tmp_path / "skills",
        {
            "task.toml": TASK_TOML,
            "instruction.md": "Greet with the skill.\n",
            "environment/Dockerfile": SKILLS_DOCKERFILE,
            "environment/skills/greeter/SKILL.md": "---\nname: greeter\ndescription: greets\n---\nRun it.\n",
            "environment/skills/greeter/scripts/greet.sh": "echo 'hello from a skill'\n",
            "solution/solve.sh": SKILLS_SOLVE_SH,
            "tests/test.sh": SKILLS_TEST_SH,
        },
    )
    result, _ = run_oracle(task, tmp_path)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result


SWAP_DOCKERFILE = """FROM reroll/base:bookworm
RUN useradd -m -u 1500 player && mkdir -p /srv/work && chown player /srv/work
USER player
WORKDIR /srv/work
"""
FAKE_TEST = "def test_answer():\\n    pass\\n"  # for printf
HIDDEN_TEST = "from answer import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
SWAP_SOLVE_SH = f"""#!/bin/sh
set -e
printf 'def answer():\\n    return 41\\n' > answer.py
mkdir -p tests
printf '{FAKE_TEST}' > /tmp/fake_test.py
nohup sh -c 'while :; do
  if grep -qs 42 tests/test_answer.py; then
    cp /tmp/fake_test.py tests/.swap && mv -f tests/.swap tests/test_answer.py
  fi
  sleep 0.01
done' > /dev/null 2>&1 &
"""
SWAP_TEST_SH = """#!/bin/sh
mkdir -p /logs/verifier /srv/work/tests
cp /tests/test_answer.py /srv/work/tests/
sleep 1  # e.g. installing the tests' requirements
cd /srv/work
if python3 -m pytest -q tests/test_answer.py; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_a_kept_process_cannot_swap_the_tests_a_test_sh_copies_into_the_workspace(
    tmp_path: Path,
) -> None:
    """Red team: an agent with a user of its own (the image's ``USER``) leaves the bug in place and
    a process that replaces the hidden test, once ``test.sh`` has copied it into the workspace,
    with one that passes. Kept alive for the verify, it must find the workspace root's."""
    task = write_files(
        tmp_path / "swap",
        {
            "task.toml": TASK_TOML,
            "instruction.md": "Make answer() return 42.\n",
            "environment/Dockerfile": SWAP_DOCKERFILE,
            "solution/solve.sh": SWAP_SOLVE_SH,
            "tests/test.sh": SWAP_TEST_SH,
            "tests/test_answer.py": HIDDEN_TEST,
        },
    )
    result, run_dir = run_oracle(task, tmp_path)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 0.0}), result
    notes = json.loads((run_dir / "verifier" / "hardening.json").read_text())["notes"]
    assert any("kept for the test script; the workspace" in note for note in notes), notes
