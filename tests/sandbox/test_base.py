"""The backend registry: built-in names, a clear error for a misspelt one, dotted paths for the rest."""

from __future__ import annotations

import pytest
from reroll.sandbox.base import create_sandbox, load_backend
from reroll.sandbox.local.isolated import local_sandbox
from reroll.sandbox.local.plain import LocalSandbox
from reroll.tasks.task import Task
from reroll_contracts.errors import SandboxBackendError

from tests.sandbox.plugin_backend import PluginSandbox


def test_a_built_in_name_loads_its_backend() -> None:
    assert load_backend("local") is local_sandbox
    assert load_backend("local-plain") is LocalSandbox


def test_a_misspelt_name_lists_the_known_ones() -> None:
    with pytest.raises(
        SandboxBackendError,
        match=r"unknown sandbox backend 'locl'; known: docker, local, local-plain, or the dotted",
    ) as typo:
        load_backend("locl")
    assert typo.value.error_category == "config" and not typo.value.retryable, "a typo is never retried"


@pytest.mark.spawns  # starts the plugin sandbox
@pytest.mark.parametrize(
    "path", ["tests.sandbox.plugin_backend:PluginSandbox", "tests.sandbox.plugin_backend.PluginSandbox"]
)
async def test_a_dotted_path_loads_an_out_of_tree_backend(path: str, task: Task) -> None:
    assert load_backend(path) is PluginSandbox
    async with create_sandbox(path, task, "plugin") as sandbox:
        assert isinstance(sandbox, PluginSandbox)
        assert (await sandbox.exec(["true"])).exit_code == 0


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("tests.sandbox.no_such_module:Sandbox", r"cannot import module 'tests\.sandbox\.no_such_module'"),
        (
            "tests.sandbox.plugin_backend:NoSuchSandbox",
            r"module 'tests\.sandbox\.plugin_backend' has no class",
        ),
    ],
)
def test_a_bad_dotted_path_says_what_is_missing(path: str, error: str) -> None:
    with pytest.raises(SandboxBackendError, match=error):
        load_backend(path)
