"""The backend registry: built-in names, a clear error for a misspelt one, dotted paths for the rest."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.base import NoSettings, Sandbox, create_sandbox, load_backend
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.local import identity
from reroll.sandbox.local.backend import local_sandbox
from reroll.sandbox.local.plain import LocalSandbox, LocalSandboxConfig
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.sandbox.spec import SandboxSpec
from reroll.tasks.task import Task
from reroll_contracts.errors import SandboxBackendError, SandboxError

from tests.sandbox.plugin_backend import PluginSandbox


def test_a_built_in_name_loads_its_backend_and_the_model_of_its_settings() -> None:
    assert load_backend("local").factory is local_sandbox
    assert load_backend("local").config_model is IsolatedSandboxConfig
    assert load_backend("local-plain").factory is LocalSandbox
    assert load_backend("local-plain").config_model is LocalSandboxConfig
    assert load_backend("docker").config_model is DockerSandboxConfig


async def test_a_backend_is_constructed_with_its_validated_settings(task: Task) -> None:
    settings = load_backend("local-plain").settings({"ready_timeout_seconds": 7})  # parsed once, here
    sandbox = create_sandbox("local-plain", sandbox_spec(task), "configured", settings)
    try:
        assert isinstance(sandbox, LocalSandbox)
        assert sandbox.config == LocalSandboxConfig(ready_timeout_seconds=7)
    finally:
        await sandbox.stop()
    docker = load_backend("docker").settings({"image_map": {"ubuntu:24.04": "reroll/base:bookworm"}})
    assert docker == DockerSandboxConfig(image_map={"ubuntu:24.04": "reroll/base:bookworm"})


@pytest.mark.parametrize(
    ("backend", "settings", "field"),
    [
        ("local", {"image_map": ["a=b"]}, "image_map"),  # local builds a task's image as docker does
        ("local-plain", {"image_map": {"a": "b"}}, "image_map"),  # a setting of the image builders
        ("local-plain", {"ready_timeout_seconds": "soon"}, "ready_timeout_seconds"),
        ("docker", {"image_map": ["a=b"]}, "image_map"),
        ("docker", {"ready_timeout_seconds": -1}, "ready_timeout_seconds"),
    ],
)
def test_invalid_settings_are_refused_naming_the_backend_and_the_field(
    backend: str, settings: dict[str, object], field: str
) -> None:
    with pytest.raises(
        SandboxBackendError, match=rf"(?s)sandbox '{backend}': invalid sandbox_config.*{field}"
    ):
        load_backend(backend).settings(settings)


class BareBackend(LocalSandbox):
    """An out-of-tree backend of the old kind: no config model, constructed with (spec, run_id)."""

    config_model = None  # type: ignore[assignment]

    def __init__(self, spec: SandboxSpec, run_id: str) -> None:
        super().__init__(spec, run_id)


async def test_a_backend_without_a_config_model_takes_no_settings(task: Task) -> None:
    path = "tests.sandbox.test_base:BareBackend"
    with pytest.raises(SandboxBackendError, match="config_model None is not a pydantic model"):
        load_backend(path)
    BareBackend.config_model = NoSettings  # type: ignore[assignment]
    try:
        sandbox = create_sandbox(path, sandbox_spec(task), "bare")
        await sandbox.stop()
        with pytest.raises(SandboxBackendError, match="invalid sandbox_config"):
            load_backend(path).settings({"ready_timeout_seconds": 1})
    finally:
        BareBackend.config_model = None


def test_the_local_backends_have_nothing_to_prune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REROLL_CACHE_DIR", str(tmp_path))  # never this machine's unpacked images
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # nor the disks of other rollouts running
    monkeypatch.setattr(identity, "SLOTS_DIR", tmp_path / "id-slots")  # nor a killed controller's range
    assert load_backend("local").prune() == {}
    assert load_backend("local-plain").prune(None, "some-run", running=True) == {}


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
    assert load_backend(path).factory is PluginSandbox
    async with create_sandbox(path, sandbox_spec(task), "plugin") as sandbox:
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


async def test_a_backend_supplies_only_its_lifecycle_and_every_operation_needs_a_start(task: Task) -> None:
    """The seam written once: a `Sandbox` subclass owes only what differs by backend; the
    operations (`SidecarClient`'s) refuse before `start`, naming the sandbox."""
    assert Sandbox.__abstractmethods__ == {
        "start",
        "stop",
        "host_address",
        "allow_host_port",
        "egress",
        "limits_hit",
    }
    sandbox = LocalSandbox(sandbox_spec(task), "unstarted")
    try:
        with pytest.raises(SandboxError, match=rf"local sandbox {sandbox.root} is not started"):
            await sandbox.put_file(sandbox.layout.path("x"), b"")
    finally:
        await sandbox.stop()


def test_a_backend_is_made_only_with_its_own_settings_model() -> None:
    """Settings travel typed to the backend: another backend's model is refused, never re-parsed."""
    with pytest.raises(
        SandboxBackendError, match="its settings are a LocalSandboxConfig, not a DockerSandboxConfig"
    ):
        load_backend("local-plain").typed(DockerSandboxConfig())
    assert load_backend("local-plain").typed(None) == LocalSandboxConfig()
