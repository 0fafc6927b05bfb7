"""The hardening a task's verifier asks for (``verifier.hardening`` of task.md / task.toml): the
steps the sidecar takes before the test script (its ``PrepareVerify`` and ``Verify`` RPCs, whose
``Hardening`` message carries these fields). The controller's task loader and sandbox seam both
speak it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class HardeningOptions(BaseModel):
    """``verifier.hardening``: the anti-reward-hacking steps before the test script (all on by default).

    A task that legitimately needs one off opts out, e.g. ``delete_injected_hooks: false`` when
    the agent is asked to write a conftest.py.
    """

    model_config = ConfigDict(extra="forbid")
    restore_build_config: bool = True
    """Put the workspace's pyproject.toml, setup.py, setup.cfg, pytest.ini, tox.ini back as they were."""
    delete_injected_hooks: bool = True
    """Delete conftest.py, sitecustomize.py, usercustomize.py and .pth files the agent added."""
    pytest_addopts: bool = True
    """Set ``PYTEST_ADDOPTS="-c /dev/null --rootdir=<workdir> --confcutdir=<verifier dir>
    -p no:cacheprovider"`` (``-c`` names the pytest configuration shipped with the tests, when
    there is one)."""
    plugin_autoload: bool = False
    """Let pytest load every installed plugin (``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` unset)."""
    pytest_report: bool = True
    """With `pytest_addopts`: trust pytest's own JUnit report (written to a root-only folder) over
    the script's exit status — a pytest that started but wrote no report (``os._exit(0)`` at
    import), or whose report counts failures or errors, zeroes every reward. Off for a task whose
    test.sh passes its own ``--junitxml`` or ``--log-file``, or expects failing tests."""
