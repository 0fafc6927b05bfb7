"""The nftables table of a rollout network (`reroll.sandbox.docker.firewall`): names, refusals, and rules
that nft accepts (checked with ``nft -c``, which changes nothing)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import pytest
from reroll.sandbox.allowlist import resolve
from reroll.sandbox.docker import firewall
from reroll_contracts.errors import SandboxError


def recording_nft(scripts: list[str]) -> Callable[..., str]:
    """A stand-in for `firewall._nft` that keeps each script it is given in `scripts`."""

    def nft(args: list[str], script: str = "") -> str:
        scripts.append(script)
        return ""

    return nft


def test_only_reroll_keys_name_a_table() -> None:
    assert firewall.table_name("0a1b2c3d4e") == "reroll_0a1b2c3d4e"
    for bad in ("", "x;flush ruleset", "0a1b2c3d4e5f6"):
        with pytest.raises(ValueError, match="not a firewall key"):
            firewall.table_name(bad)


def test_a_port_outside_the_tcp_range_is_refused() -> None:
    for port in (0, 65536, -1):
        with pytest.raises(ValueError, match="not a TCP port"):
            firewall.allow_port("0a1b2c3d4e", port)


def test_without_nft_network_none_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(SandboxError, match="needs nftables' nft program"):
        firewall.install("0a1b2c3d4e", "rr-0a1b2c3d4e", "172.30.0.1")


@pytest.mark.spawns
@pytest.mark.parametrize("within", [False, True])
def test_nft_accepts_the_rules(monkeypatch: pytest.MonkeyPatch, within: bool) -> None:
    scripts: list[str] = []
    monkeypatch.setattr(firewall, "_nft", recording_nft(scripts))
    firewall.install("0a1b2c3d4e", "rr-0a1b2c3d4e", "172.30.0.1", within=within)
    among = 'iifname "rr-0a1b2c3d4e" oifname "rr-0a1b2c3d4e" accept'
    assert (among in scripts[0]) == within  # a rollout with services: its containers meet
    nft = shutil.which("nft", path="/usr/sbin:/sbin")
    if nft is None:
        pytest.skip("no nft on this machine")
    checked = subprocess.run([nft, "-c", "-f", "-"], input=scripts[0], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert 'iifname "rr-0a1b2c3d4e" ip daddr 172.30.0.1 tcp dport @ports accept' in scripts[0]


@pytest.mark.spawns
def test_nft_accepts_an_allow_list_and_its_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A routed bridge's table: the sets' addresses forwarded, answers back, anything else refused;
    `set_allowed` flushes both sets and fills them (an empty family stays empty)."""
    scripts: list[str] = []
    monkeypatch.setattr(firewall, "_nft", recording_nft(scripts))
    allowed = resolve(("10.251.7.2", "192.0.2.0/24", "2001:db8::1"))
    firewall.install("0a1b2c3d4e", "rr-0a1b2c3d4e", "172.30.0.1", allowed=allowed)
    firewall.set_allowed("0a1b2c3d4e", resolve(("10.251.7.3",)))
    install, swap = scripts
    forward = install[install.index("chain forward") :]
    assert forward.index("@allow4 accept") < forward.index('iifname "rr-0a1b2c3d4e" meta l4proto tcp reject')
    assert 'oifname "rr-0a1b2c3d4e" ct state established,related accept' in forward
    assert swap.splitlines() == [
        "flush set inet reroll_0a1b2c3d4e allow4",
        "add element inet reroll_0a1b2c3d4e allow4 { 10.251.7.3/32 }",
        "flush set inet reroll_0a1b2c3d4e allow6",
        "flush set inet reroll_0a1b2c3d4e deny4",  # a phase without a deny list empties them
        "flush set inet reroll_0a1b2c3d4e deny6",
    ]
    nft = shutil.which("nft", path="/usr/sbin:/sbin")
    if nft is None:
        pytest.skip("no nft on this machine")
    elements = "\n".join(
        f"add element inet reroll_0a1b2c3d4e allow{version} {{ {', '.join(allowed.of_version(version))} }}"
        for version in (4, 6)
    )
    checked = subprocess.run([nft, "-c", "-f", "-"], input=install + elements, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.spawns
def test_nft_accepts_a_deny_list_rejected_before_the_allow_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deny list (every address allowed but the denied hosts'): the deny sets are filled and
    their rules come before the allow sets' accept."""
    scripts: list[str] = []
    monkeypatch.setattr(firewall, "_nft", recording_nft(scripts))
    denied = resolve(("0.0.0.0/0", "::/0"), ("localhost",))  # the host's resolver: 127.0.0.1, ::1
    firewall.install("0a1b2c3d4e", "rr-0a1b2c3d4e", "172.30.0.1", allowed=denied)
    firewall.set_allowed("0a1b2c3d4e", denied)
    install, swap = scripts
    forward = install[install.index("chain forward") :]
    assert forward.index("@deny4 reject") < forward.index("@allow4 accept")
    assert forward.index("@deny6 reject") < forward.index("@allow6 accept")
    assert "add element inet reroll_0a1b2c3d4e deny4 { 127.0.0.1/32 }" in swap.splitlines()
    assert "add element inet reroll_0a1b2c3d4e allow4 { 0.0.0.0/0 }" in swap.splitlines()
    nft = shutil.which("nft", path="/usr/sbin:/sbin")
    if nft is None:
        pytest.skip("no nft on this machine")
    checked = subprocess.run([nft, "-c", "-f", "-"], input=install + swap, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
