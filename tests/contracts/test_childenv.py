"""`reroll_contracts.childenv`: what reroll's own children may know."""

from __future__ import annotations

import subprocess
import sys

import pytest
from reroll_contracts.childenv import child_environment


def test_a_child_keeps_locale_paths_and_tls_but_no_secret() -> None:
    controller = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LC_ALL": "C.UTF-8",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "REQUESTS_CA_BUNDLE": "/etc/ca.pem",
        "https_proxy": "http://proxy:3128",
        "PIP_INDEX_URL": "https://mirror/simple",
        "OPENAI_API_KEY": "sk-secret",
        "ANTHROPIC_API_KEY": "sk-ant",
        "GITHUB_TOKEN": "ghp",
        "AWS_SECRET_ACCESS_KEY": "x",
        "PIP_PASSWORD": "x",
        "SOMETHING_ELSE": "x",
    }
    kept = child_environment({"EXTRA": "1"}, environ=controller)
    assert kept == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LC_ALL": "C.UTF-8",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "REQUESTS_CA_BUNDLE": "/etc/ca.pem",
        "https_proxy": "http://proxy:3128",
        "PIP_INDEX_URL": "https://mirror/simple",
        "EXTRA": "1",
    }


@pytest.mark.spawns
def test_hide_from_same_user_makes_the_process_non_dumpable() -> None:
    script = (
        "import ctypes; from reroll_contracts.childenv import hide_from_same_user;"
        "libc = ctypes.CDLL(None); before = libc.prctl(3, 0, 0, 0, 0);"  # PR_GET_DUMPABLE
        "print(before, hide_from_same_user(), libc.prctl(3, 0, 0, 0, 0))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "True", "0"]
