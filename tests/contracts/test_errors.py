"""The exception tree: one tree over controller, proxy and sidecar, drawn once, each class with its
stable category; the proxy and the sidecar load it without the controller."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import get_args

import pytest
from reroll.sandbox.base import load_backend
from reroll_contracts import errors
from reroll_contracts.errors import (
    RETRIED_CATEGORIES,
    ConfigError,
    ErrorCategory,
    FaultPlanError,
    InfrastructureError,
    RerollError,
    SandboxBackendError,
    error_category,
)
from reroll_contracts.faults import load_plan

CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, RerollError)]


def test_every_class_is_drawn_in_the_tree_with_a_stable_category() -> None:
    doc = errors.__doc__ or ""
    tree = doc[doc.index("    RerollError ") : doc.index("Raised outside")]
    drawn = re.findall(r"^    (?:[│ ]   )*(?:[├└]── )?(\w+) ", tree, flags=re.MULTILINE)
    assert sorted(drawn) == sorted(cls.__name__ for cls in CLASSES)
    for cls in CLASSES:
        assert cls.error_category in get_args(ErrorCategory)
        assert cls.error_category != cls.__name__


def raised_in(module: ModuleType, name: str) -> type[RerollError]:
    """The class `module` raises as `name`, imported there (not re-exported: hence `getattr`)."""
    cls = getattr(module, name)
    assert isinstance(cls, type) and issubclass(cls, RerollError), f"{module.__name__}.{name}"
    return cls


def test_the_proxys_and_sidecars_errors_are_the_trees() -> None:
    import reroll_contracts.faults
    import reroll_contracts.trajectory
    import reroll_proxy.config
    import reroll_proxy.translate
    import reroll_sidecar.snapshot_io
    import reroll_sidecar.snapshots
    import reroll_sidecar.verify

    assert raised_in(reroll_contracts.faults, "FaultPlanError") is FaultPlanError  # defined once
    assert issubclass(raised_in(reroll_proxy.config, "ProxyConfigError"), ConfigError)
    assert issubclass(raised_in(reroll_contracts.trajectory, "TrajectoryFormatError"), errors.RunFolderError)
    assert raised_in(reroll_proxy.translate, "TranslationError").error_category == "agent_error"
    for module, name in (
        (reroll_sidecar.verify, "VerifyError"),
        (reroll_sidecar.snapshots, "SnapshotError"),
        (reroll_sidecar.snapshot_io, "ToolError"),
    ):
        assert issubclass(raised_in(module, name), errors.SandboxError)


def test_only_infrastructure_is_retried_and_config_errors_never() -> None:
    assert {"infrastructure"} == RETRIED_CATEGORIES
    for cls in CLASSES:
        assert cls.retryable == issubclass(cls, InfrastructureError), cls.__name__
    with pytest.raises(SandboxBackendError, match="unknown sandbox backend 'dockr'") as typo:
        load_backend("dockr")
    assert not typo.value.retryable and error_category(typo.value) == "config"


def test_a_bad_fault_plan_from_the_proxy_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read the fault plan") as caught:
        load_plan(tmp_path / "nope.yaml")
    assert error_category(caught.value) == "config"
    assert error_category(KeyError("x")) == "internal"


@pytest.mark.spawns
def test_the_tree_loads_without_the_controller() -> None:
    """The sidecar and the proxy load the exception tree without loading the controller."""
    probe = (
        "import sys, reroll_contracts.errors, reroll_sidecar.server, reroll_proxy.config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'reroll'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
