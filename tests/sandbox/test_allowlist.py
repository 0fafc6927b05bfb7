"""A phase's allow-list as addresses (`reroll.sandbox.allowlist`): resolved on the host, wildcards
and unknown names unreachable, ``full`` everything."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest
from reroll.sandbox import allowlist
from reroll.sandbox.allowlist import EVERYWHERE, Resolved, resolve


def test_addresses_and_ranges_are_taken_as_they_are_names_are_looked_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[str] = []

    def lookup(name: str) -> list[str]:
        looked_up.append(name)
        return {"pypi.org": ["151.101.0.223", "151.101.0.223", "2a04:4e42::223"]}.get(name, [])

    monkeypatch.setattr(allowlist, "_lookup", lookup)
    resolved = resolve(("10.0.0.0/8", "192.0.2.7", "pypi.org", "*.example.com", "nowhere.invalid"))
    assert looked_up == ["pypi.org", "nowhere.invalid"]  # never a wildcard, never an address
    assert resolved.of_version(4) == ["10.0.0.0/8", "192.0.2.7/32", "151.101.0.223/32"]
    assert resolved.of_version(6) == ["2a04:4e42::223/128"]
    assert resolved.unresolved == ("*.example.com", "nowhere.invalid")
    assert resolved.hosts_file_lines() == "151.101.0.223 pypi.org\n2a04:4e42::223 pypi.org\n"


def test_a_deny_list_s_names_are_looked_up_and_denied_with_their_subdomains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        allowlist, "_lookup", lambda name: {"blocked.example": ["192.0.2.9", "2001:db8::9"]}.get(name, [])
    )
    resolved = resolve(None, ("blocked.example", "gone.example"))
    assert resolved.networks == EVERYWHERE and resolved.denied_names == ("blocked.example", "gone.example")
    assert resolved.of_version(4, denied=True) == ["192.0.2.9/32"]
    assert resolved.of_version(6, denied=True) == ["2001:db8::9/128"]
    assert resolved.denies("a.b.blocked.example") and resolved.denies("gone.example")
    assert resolved.denies("192.0.2.9") and not resolved.denies("192.0.2.10")
    assert not resolved.denies("notblocked.example") and not resolve(None).denies("192.0.2.9")


def test_full_is_everywhere_and_an_empty_list_nothing() -> None:
    assert resolve(None).networks == EVERYWHERE
    assert resolve(()).networks == ()


@pytest.mark.spawns
def test_the_hosts_resolver_is_the_host_s() -> None:
    assert ipaddress.ip_network("127.0.0.1/32") in resolve(("localhost",)).networks


async def test_what_gave_no_address_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to write in ``/etc/hosts``: the sandbox is not asked; the unreachable entries are said."""
    await allowlist.name_hosts(None, Resolved(unresolved=("*.said-once.example",)))  # type: ignore[arg-type]
    assert "*.said-once.example gave no address on this host: unreachable" in capsys.readouterr().err


class _Shell:
    """A sandbox whose exec runs here (the script of `name_hosts` on a file of the test's)."""

    async def exec(self, argv: list[str], timeout_seconds: float) -> None:
        subprocess.run(argv, check=True, timeout=timeout_seconds)


@pytest.mark.spawns
async def test_names_go_into_etc_hosts_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    monkeypatch.setattr(allowlist, "HOSTS_FILE", str(hosts))
    resolved = Resolved(names=(("pypi.org", "151.101.0.223"), ("pypi.org", "2a04:4e42::223")))
    for _ in range(2):
        await allowlist.name_hosts(_Shell(), resolved)  # type: ignore[arg-type]
    assert hosts.read_text() == "127.0.0.1 localhost\n151.101.0.223 pypi.org\n2a04:4e42::223 pypi.org\n"
