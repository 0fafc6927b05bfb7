"""The rollout container's seccomp profile: Docker's default plus a verify's namespaces only."""

from __future__ import annotations

import json

from reroll.sandbox.docker import seccomp
from reroll_contracts.namespaces import VERIFY_NAMESPACES_OWN_NET


def test_the_profile_is_dockers_default_with_two_rules_appended() -> None:
    profile = json.loads(seccomp.profile())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"  # never an allow-all profile
    assert "moby/profiles" in profile["comment"] and "Apache" in profile["comment"]
    added = [rule for rule in profile["syscalls"] if rule.get("comment", "").startswith("reroll:")]
    assert [rule["names"] for rule in added] == [["unshare"], ["mount", "umount2"]]
    assert profile["syscalls"][-2:] == added


def test_unshare_is_allowed_for_the_verify_flags_and_nothing_else() -> None:
    arguments = seccomp.RULES[0]["args"]
    assert isinstance(arguments, list)
    (argument,) = arguments
    mask = argument["value"]
    clone_newnet, clone_newcgroup = 0x40000000, 0x02000000
    assert mask & VERIFY_NAMESPACES_OWN_NET == 0 and argument["valueTwo"] == 0
    assert mask & clone_newcgroup and not mask & clone_newnet  # a stricter verifier's own network
