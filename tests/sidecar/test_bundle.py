"""`reroll_sidecar.bundle`: what the frozen sidecar changes about itself (no bundle needed)."""

from __future__ import annotations

import pytest
from reroll_sidecar import bundle


def test_outside_a_bundle_tools_come_from_path_and_the_environment_is_left_alone() -> None:
    environ = {"LD_LIBRARY_PATH": "/x", "_PYI_ARCHIVE_FILE": "/y"}
    bundle.scrub_environment(environ)
    assert bundle.tool("tar") == "tar"
    assert environ == {"LD_LIBRARY_PATH": "/x", "_PYI_ARCHIVE_FILE": "/y"}


def test_in_a_bundle_the_launchers_variables_go_and_the_original_library_path_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bundle, "BUNDLE_DIR", "/opt/reroll-sidecar/_internal")
    assert bundle.tool("find") == "/opt/reroll-sidecar/_internal/tools/find"
    launched = {
        "PATH": "/bin",
        "LD_LIBRARY_PATH": "/opt/reroll-sidecar/_internal",
        "_PYI_PARENT_PROCESS_LEVEL": "-1",
    }
    bundle.scrub_environment(launched)
    assert launched == {"PATH": "/bin"}
    restored = {"LD_LIBRARY_PATH": "/opt/reroll-sidecar/_internal", "LD_LIBRARY_PATH_ORIG": "/usr/local/lib"}
    bundle.scrub_environment(restored)
    assert restored == {"LD_LIBRARY_PATH": "/usr/local/lib"}
