"""The interception helpers: the sandbox environment, and the installer's error without PyPI."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.host.intercept import MITMPROXY_REQUIREMENT, ensure_mitmproxy, sandbox_env
from reroll_contracts.errors import InfrastructureError


def test_sandbox_env_names_the_proxy_and_the_bundle_for_every_client() -> None:
    env = sandbox_env("http://172.18.0.1:4000", "/etc/reroll/intercept-ca.pem", no_proxy=["172.18.0.1"])
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        assert env[name] == "http://172.18.0.1:4000"
    assert env["NO_PROXY"] == env["no_proxy"] == "172.18.0.1,localhost,127.0.0.1"
    assert env["NODE_USE_ENV_PROXY"] == "1"
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        assert env[name] == "/etc/reroll/intercept-ca.pem"


@pytest.mark.spawns
def test_install_without_pypi_fails_with_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REROLL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(InfrastructureError, match=f"installing {MITMPROXY_REQUIREMENT} from PyPI") as caught:
        ensure_mitmproxy()
    assert "HTTPS interception needs PyPI once" in str(caught.value)
    assert not (tmp_path / "mitmproxy" / MITMPROXY_REQUIREMENT.replace("==", "-") / ".installed").exists()
