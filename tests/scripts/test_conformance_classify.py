"""scripts/conformance/classify.py: an oracle rollout's class from its run folder's evidence."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "conformance" / "classify.py"


@pytest.fixture(scope="module")
def classify() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_classify", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rollout(root: Path, error: str, reward: float | None = None) -> Path:
    root.mkdir()
    result = {"status": "error" if error else "ok", "error": error, "rewards": {"reward": reward or 0}}
    (root / "result.json").write_text(json.dumps(result))
    return root


UNPULLED = (
    "task/environment/Dockerfile starts FROM {image}, which is not a local image and could not be "
    "pulled (no registry reachable?). map it with one flag: reroll run … --image-map {image}=…"
)


@pytest.mark.parametrize(
    ("image", "verdict"),
    [
        ("python:3.12-slim", "reroll-defect"),
        ("docker.io/library/node:20", "reroll-defect"),
        ("ubuntu:20.04", "reroll-defect"),
        ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "needs-internet"),
        ("org/image:1", "needs-internet"),
        ("localhost:5000/image", "needs-internet"),
    ],
)
def test_an_image_that_is_not_local_is_a_defect_only_when_official(
    classify: ModuleType, tmp_path: Path, image: str, verdict: str
) -> None:
    """An official image is one reroll's catalogue could stand in for; another registry's is out
    of reach."""
    classified = classify.classify_rollout(_rollout(tmp_path / "r", UNPULLED.format(image=image)), "t")
    assert classified.verdict == verdict and image in classified.evidence


def test_a_pass_a_network_failure_and_a_missing_result(classify: ModuleType, tmp_path: Path) -> None:
    assert classify.classify_rollout(_rollout(tmp_path / "ok", "", reward=1.0), "t").verdict == "pass"
    dns = _rollout(tmp_path / "dns", "pip: Temporary failure in name resolution")
    assert classify.classify_rollout(dns, "t").verdict == "needs-internet"
    ghcr = _rollout(
        tmp_path / "ghcr",
        "docker build of t/environment/Dockerfile failed: "
        "invalid from flag value ghcr.io/astral-sh/uv:0.8.15: "
        'Get "https://ghcr.io/v2/": dial tcp: lookup ghcr.io on 10.255.255.53:53: no such host',
    )
    assert classify.classify_rollout(ghcr, "t").verdict == "needs-internet"  # a COPY --from image
    wget = _rollout(  # wget -q prints nothing; its status 4 is "network failure"
        tmp_path / "wget",
        "docker build of t/environment/Dockerfile failed: The command '/bin/sh -c wget -q "
        "https://dl-cdn.alpinelinux.org/alpine/a.iso -O /app/a.iso' returned a non-zero code: 4",
    )
    assert classify.classify_rollout(wget, "t").verdict == "needs-internet"
    cran = _rollout(tmp_path / "cran", "agent exited with code 1: there is no package called 'remotes'")
    (cran / "agent").mkdir()
    (cran / "agent" / "output.log").write_text(
        "Warning: unable to access index for repository https://cloud.r-project.org/src/contrib:\n"
        "  cannot open URL 'https://cloud.r-project.org/src/contrib/PACKAGES'\n"
    )
    assert classify.classify_rollout(cran, "t").verdict == "needs-internet"
    secret = _rollout(
        tmp_path / "secret",
        "environment.env.GH_TOKEN asks for the host's GH_TOKEN, which looks like a secret: reroll never",
    )
    assert classify.classify_rollout(secret, "t").verdict == "needs-internet"
    (tmp_path / "none").mkdir()
    missing = classify.classify_rollout(tmp_path / "none", "t")
    assert missing.verdict == "reroll-defect" and "no result.json" in missing.evidence


def test_a_task_reroll_refuses_is_a_row_not_a_dead_job(classify: ModuleType) -> None:
    """A refusal at load is reroll's defect unless it names a file the task lacks."""
    refused = classify.classify_refusal("t", "t/environment/task.toml: unknown field 'x'\nmore")
    assert (refused.verdict, refused.status) == ("reroll-defect", "refused")
    assert refused.evidence == "refused when loading: t/environment/task.toml: unknown field 'x'"
    broken = classify.classify_refusal("t", "COPY failed: file not found in build context: data.csv")
    assert broken.verdict == "task-broken"


@pytest.mark.parametrize(
    ("relative", "text", "host"),
    [
        ("tests/test.sh", "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\n", "astral.sh"),
        ("environment/Dockerfile", "RUN git clone https://github.com/o/r.git\n", "github.com"),
        ("solution/solve.py", "urllib.request.urlopen('https://example.org/data.csv')\n", "example.org"),
        ("tests/test.sh", "curl -s http://localhost:8888/status\ncurl http://api:4000/\n", None),
        ("tests/test.sh", "# curl https://astral.sh/uv/install.sh | sh\npython3 -m pytest\n", None),
        ("environment/Dockerfile", "RUN curl -O https://files.pythonhosted.org/packages/x.whl\n", None),
    ],
)
def test_a_task_whose_files_download_from_hosts_out_of_reach_is_not_run(
    classify: ModuleType, tmp_path: Path, relative: str, text: str, host: str | None
) -> None:
    """--skip-online: a download from the internet in the verifier, the build or the solution
    decides needs-internet before anything runs; loopback, a compose service, a comment and PyPI
    do not."""
    task = tmp_path / "t"
    (task / relative).parent.mkdir(parents=True)
    (task / relative).write_text(text)
    row = classify.classify_static(task)
    if host is None:
        assert row is None
    else:
        assert (row.verdict, row.status) == ("needs-internet", "not run")
        assert f"downloads from {host} ({relative}:" in row.evidence


def test_a_reviewed_failure_takes_its_class_and_a_pass_stays_a_pass(
    classify: ModuleType, tmp_path: Path
) -> None:
    reviewed = tmp_path / "reviewed.yaml"
    reviewed.write_text(
        "flaky:\n  class: task-broken\n  evidence: >-\n    random noise,\n    seen outside reroll\n"
    )
    rows = [
        classify.Classified("flaky", "reroll-defect", "ok", 0.0, "status ok, reward 0.0", ""),
        classify.Classified("other", "reroll-defect", "ok", 0.0, "status ok, reward 0.0", ""),
    ]
    flaky, other = classify.apply_reviews(rows, reviewed)
    assert (flaky.verdict, flaky.evidence) == ("task-broken", "reviewed: random noise, seen outside reroll")
    assert other == rows[1]
    passed = classify.Classified("flaky", "pass", "ok", 1.0, "", "")
    assert classify.apply_reviews([passed], reviewed) == [passed]


@pytest.mark.parametrize(
    "text", ["- a list\n", "t:\n  class: pass\n  evidence: x\n", "t:\n  class: task-broken\n"]
)
def test_a_review_without_a_failure_class_or_evidence_is_refused(
    classify: ModuleType, tmp_path: Path, text: str
) -> None:
    reviewed = tmp_path / "reviewed.yaml"
    reviewed.write_text(text)
    with pytest.raises(ValueError, match=r"reviewed\.yaml"):
        classify.apply_reviews([], reviewed)


def test_the_bundled_reviews_load(classify: ModuleType) -> None:
    bundled = SCRIPT.parent / "reviewed.yaml"
    row = classify.Classified("r2r-mpc-control", "reroll-defect", "ok", 0.0, "", "")
    assert classify.apply_reviews([row], bundled)[0].verdict == "task-broken"
