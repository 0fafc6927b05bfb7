"""A deny list's matching as BenchFlow 0.7.11 defines it (``_egress_denylist_proxy.Policy``): a host
and its subdomains; a URL prefix by host key and decoded path, whatever the scheme and port."""

from __future__ import annotations

import pytest
from reroll_proxy.intercept.url_denylist import (
    UrlDenylist,
    UrlEntry,
    host_key,
    is_host_local,
    path_key,
    url_entry,
)

DENYLIST = UrlDenylist.parse(
    ["Blocked.Example.", "pypi.org"], ["https://docs.example.com/Answers/", "example.com"]
)


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/a/b?x=1#f", "/a/b"),
        ("/A/./b/../C", "/a/c"),
        ("/a/%2e%2e/b", "/b"),
        ("/a/%252e%252e/b", "/b"),  # decoded twice
        ("/a\\b", "/a/b"),
        ("/a;jsessionid=1/b", "/a/b"),
        ("//a///b/", "/a/b/"),
        ("/../..", "/"),
        ("", "/"),
    ],
)
def test_paths_are_compared_decoded_and_resolved(path: str, key: str) -> None:
    assert path_key(path) == key


def test_a_host_key_drops_www_case_and_the_trailing_dot() -> None:
    assert host_key("WWW.Docs.Example.com.") == "docs.example.com"
    assert url_entry("docs.example.com/x/") == UrlEntry("docs.example.com", "/x")


@pytest.mark.parametrize(
    ("host", "path", "rule"),
    [
        ("docs.example.com", "/answers", "url:docs.example.com/answers"),
        ("www.docs.example.com", "/ANSWERS/q1?x", "url:docs.example.com/answers"),
        ("docs.example.com", "/public/../answers/1", "url:docs.example.com/answers"),
        ("docs.example.com", "/%61nswers", "url:docs.example.com/answers"),
        ("docs.example.com", "/answers2", "url:docs.example.com/answers"),  # BenchFlow's string prefix
        ("docs.example.com", "/public/answers", None),
        ("api.docs.example.com", "/answers", None),  # a URL entry holds its host only
        ("example.com", "/anything", "url:example.com/"),
        ("blocked.example", "/", "host:blocked.example"),
        ("a.b.blocked.example", "/x", "host:blocked.example"),
        ("notblocked.example", "/x", None),
        ("files.pypi.org", "/x", "host:pypi.org"),
    ],
)
def test_urls_under_an_entry_and_hosts_with_their_subdomains_are_denied(
    host: str, path: str, rule: str | None
) -> None:
    assert DENYLIST.url_rule(host, path) == rule


def test_a_url_host_s_address_is_reached_only_under_its_name() -> None:
    listed = frozenset({"10.0.0.5"})
    assert DENYLIST.listed_address_rule("docs.example.com", "10.0.0.5", listed) is None
    assert DENYLIST.listed_address_rule("www.docs.example.com", "10.0.0.5", listed) is None
    assert DENYLIST.listed_address_rule("10.0.0.5", "10.0.0.5", listed) is not None
    assert DENYLIST.listed_address_rule("alias.example.net", "10.0.0.5", listed) is not None
    assert DENYLIST.listed_address_rule("alias.example.net", "10.0.0.6", listed) is None
    assert "www.docs.example.com" in DENYLIST.url_hosts


@pytest.mark.parametrize(
    ("address", "local"),
    [("127.0.0.1", True), ("127.9.8.7", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("0.0.0.0", True), ("169.254.169.254", True), ("fe80::1%eth0", True), ("10.1.2.3", False),
     ("203.0.113.80", False)],
)  # fmt: skip
def test_the_interceptor_s_own_host_is_not_a_destination(address: str, local: bool) -> None:
    assert is_host_local(address) is local
