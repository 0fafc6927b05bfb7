"""The controller's proxy handle: the divergence policy reaches the proxy's config file."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from reroll.llm_proxy import DivergencePolicy, LlmProxy, ReplayPlan
from reroll_proxy.config import load_config


@pytest.mark.parametrize("policy", ["warn", "strict", "cutover"])
def test_the_divergence_policy_is_passed_to_the_proxy(tmp_path: Path, policy: DivergencePolicy) -> None:
    replay = ReplayPlan(trajectory_path=tmp_path / "recorded.jsonl", cut_index=3, divergence_policy=policy)
    LlmProxy(workdir=tmp_path, trajectory_path=tmp_path / "out.jsonl", upstream=None, replay=replay)
    written = orjson.loads((tmp_path / "proxy.json").read_bytes())
    assert (written["divergence_policy"], written["cut_index"]) == (policy, 3)
    config = load_config(tmp_path / "proxy.json")
    assert config.divergence_policy == policy and config.cut_index == 3
