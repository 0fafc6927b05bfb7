"""`reroll_contracts.yamltext`: the C safe loader, with the pure Python one's values and refusals."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml
from reroll_contracts import yamltext

from tests.conftest import EXAMPLES


def test_the_c_loader_is_used_and_reads_what_the_python_one_reads() -> None:
    assert yamltext._LOADER is yaml.CSafeLoader  # PyYAML's wheels are built with libyaml
    texts = [
        resources.files("reroll").joinpath("agents.yaml").read_text(encoding="utf-8"),
        (EXAMPLES / "sqlite-ledger" / "scripted-model.yaml").read_text(encoding="utf-8"),
    ]
    for text in texts:
        assert yamltext.safe_load(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text",
    [
        "turns: [content: x\n",  # not YAML
        "!!python/object/apply:os.system ['true']\n",  # a tag only an unsafe loader constructs
    ],
)
def test_it_refuses_what_the_safe_loader_refuses(text: str) -> None:
    with pytest.raises(yaml.YAMLError):
        yamltext.safe_load(text)
