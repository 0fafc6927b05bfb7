"""Harbor's and benchflow's task fields mapped onto reroll's, or reported as ignored (unit tests)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from reroll.tasks.compat import normalise, parse_size_mib, prompt_of, resolve_env, split_ignored
from reroll.tasks.spec import TaskSpec
from reroll_contracts.errors import TaskError
from reroll_contracts.network import NetworkPolicy, PhaseNetworks


def spec(raw: dict[str, Any]) -> tuple[TaskSpec, list[tuple[str, str]]]:
    data, _ = normalise(raw)
    ignored = split_ignored(data, TaskSpec)
    return TaskSpec.model_validate(data), ignored


@pytest.mark.parametrize(
    ("size", "mib"), [("4G", 4096), ("512M", 512), ("1.5G", 1536), ("2Gi", 2048), (768, 768)]
)
def test_sizes_as_harbor_writes_them(size: object, mib: int) -> None:
    assert parse_size_mib(size, "environment.memory") == mib


def test_a_bad_size_names_the_field() -> None:
    with pytest.raises(TaskError, match=r"environment\.memory: 'lots' is not a size"):
        parse_size_mib("lots", "environment.memory")


def test_harbor_memory_string_wins_over_memory_mb_and_is_reported_as_mapped() -> None:
    data, mapped = normalise({"environment": {"memory": "4G", "memory_mb": 1024}})
    assert data["environment"]["memory_mb"] == 4096
    assert ("environment.memory", "environment.memory_mb") in mapped


@pytest.mark.parametrize(
    ("environment", "network"),
    [
        ({"allow_internet": False}, "none"),
        ({"allow_internet": True}, "full"),
        ({"network_mode": "no-network"}, "none"),
        ({"network_mode": "public", "allow_internet": False}, "full"),  # network_mode first, as Harbor
        ({"network_mode": "allowlist", "allowed_hosts": ["pypi.org"]}, "none"),  # + its hosts
        ({"network": "none", "allow_internet": True}, "none"),  # reroll's own field wins
        ({}, "full"),
    ],
)
def test_network_policy_from_allow_internet_and_network_mode(
    environment: dict[str, Any], network: str
) -> None:
    assert spec({"environment": environment})[0].environment.network == network


def test_an_allowlist_is_none_plus_its_hosts_in_every_phase_that_sets_none() -> None:
    parsed, ignored = spec(
        {
            "sandbox": {"network_mode": "allowlist", "allowed_hosts": ["PyPI.org.", "10.0.0.0/8"]},
            "verifier": {"network_mode": "allowlist", "allowed_hosts": ["*.example.com", "2001:DB8::1"]},
        }
    )
    assert ignored == []
    assert parsed.networks() == PhaseNetworks(
        agent="none",
        verifier="none",
        agent_allowed=("pypi.org", "10.0.0.0/8"),
        verifier_allowed=("*.example.com", "2001:db8::1"),
    )


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"network_mode": "allowlist", "allowed_hosts": ["https://pypi.org"]}, "not a hostname"),
        ({"network_mode": "allowlist", "allowed_hosts": ["pypi.org:443"]}, "not a hostname"),
        ({"network_mode": "allowlist", "allowed_hosts": ["10.0.0.1/8"]}, "not a hostname"),
        ({"network_mode": "allowlist", "allowed_hosts": ["a.*.org"]}, "leading"),
        ({"network_mode": "public", "allowed_hosts": ["pypi.org"]}, "needs network none"),
        ({"allowed_hosts": ["pypi.org"]}, "needs network none"),  # the sandbox's full
    ],
)
def test_an_allowlist_harbor_refuses_is_refused(section: dict[str, Any], match: str) -> None:
    """Harbor's forms only (hostname, ``*.`` wildcard, IP, CIDR with host bits clear), and only
    with a policy that is not ``full``."""
    with pytest.raises((TaskError, ValidationError), match=match):
        spec({"agent": section})


@pytest.mark.parametrize(
    ("raw", "agent", "verifier"),
    [
        ({}, "full", "full"),
        ({"sandbox": {"network_mode": "no-network"}}, "none", "none"),  # every phase inherits it
        ({"sandbox": {"network_mode": "no-network"}, "verifier": {"network_mode": "public"}}, "none", "full"),
        ({"agent": {"network_mode": "no-network"}}, "none", "full"),
        ({"verifier": {"network_mode": "no-network"}}, "full", "none"),
        (  # an allowlist phase without hosts (Harbor takes it, BenchFlow not) reaches nothing
            {"sandbox": {"allow_internet": True}, "verifier": {"network_mode": "allowlist"}},
            "full",
            "none",
        ),
        ({"agent": {"network_mode": "public", "network": "none"}}, "none", "full"),  # reroll's own wins
    ],
)
def test_each_phase_has_its_own_network_policy(
    raw: dict[str, Any], agent: NetworkPolicy, verifier: NetworkPolicy
) -> None:
    """BenchFlow's ``agent.network_mode`` and ``verifier.network_mode`` override the sandbox's
    (``sandbox.network_mode``, ``allow_internet``) for their phase; the oracle's is the agent's."""
    parsed, _ = spec(raw)
    assert parsed.networks() == PhaseNetworks(agent=agent, verifier=verifier)


def test_a_phase_network_mode_is_mapped_not_ignored() -> None:
    _, ignored = spec({"agent": {"network_mode": "no-network"}, "verifier": {"network_mode": "public"}})
    assert ignored == []
    _, mapped = normalise({"agent": {"network_mode": "no-network"}})
    assert ("agent.network_mode", "agent.network = none") in mapped


def test_a_deny_list_s_hosts_are_kept() -> None:
    """BenchFlow's ``blocked_hosts`` (hostnames) are enforced for the agent phase: ``none`` with
    every address allowed but theirs."""
    task, ignored = spec(
        {
            "sandbox": {"network_mode": "denylist", "blocked_hosts": ["Example.COM.", "pypi.org"]},
            "verifier": {"network_mode": "allowlist", "allowed_hosts": ["pypi.org"]},
        }
    )
    assert ignored == []
    networks = task.networks()
    assert (networks.agent, networks.agent_allowed) == ("none", ("0.0.0.0/0", "::/0"))
    assert networks.agent_denied == ("example.com", "pypi.org")
    assert (networks.verifier, networks.verifier_allowed) == ("none", ("pypi.org",))  # its own


def test_a_deny_list_s_urls_are_kept_and_spelt_as_benchflow_does() -> None:
    """BenchFlow's ``blocked_urls`` (URL prefixes) are enforced through the interceptor: the agent
    phase reaches nothing directly (``none``, nothing allowed); spelt as BenchFlow 0.7.11's
    ``_validate_blocked_urls`` (scheme added, host lower-cased, query and trailing slash dropped)."""
    task, ignored = spec(
        {
            "sandbox": {
                "network_mode": "denylist",
                "blocked_hosts": ["pypi.org"],
                "blocked_urls": [
                    "https://GitHub.com./org/answers/?q=1",
                    "docs.example.com",
                    "http://a.example/x",
                ],
            }
        }
    )
    assert ignored == []
    networks = task.networks()
    assert (networks.agent, networks.agent_allowed, networks.agent_denied) == ("none", (), ("pypi.org",))
    assert networks.agent_blocked_urls == (
        "https://github.com/org/answers",
        "https://docs.example.com",
        "http://a.example/x",
    )
    assert (networks.verifier, networks.verifier_looser) == ("full", True)


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/x", "https://user@example.com/x", "https://example.com:8443/x", "10.0.0.1/x", ""],
)
def test_a_blocked_url_names_a_host_over_http_or_https(url: str) -> None:
    with pytest.raises(ValidationError, match="blocked_urls"):
        spec({"sandbox": {"network_mode": "denylist", "blocked_urls": [url]}})


@pytest.mark.parametrize("host", ["10.0.0.1", "*.example.com", "https://example.com", "example.com:443", ""])
def test_a_deny_list_takes_hostnames_only(host: str) -> None:
    with pytest.raises(ValidationError, match="blocked_hosts"):
        spec({"sandbox": {"network_mode": "denylist", "blocked_hosts": [host]}})


@pytest.mark.parametrize("field", ["blocked_hosts", "blocked_urls"])
def test_a_deny_list_under_no_network_is_refused(field: str) -> None:
    denylist = {"network_mode": "denylist", field: ["example.com"]}
    with pytest.raises(ValidationError, match=f"{field} needs network full"):
        spec({"sandbox": denylist, "agent": {"network_mode": "no-network"}})


@pytest.mark.parametrize(
    "raw",
    [
        {"agent": {"network_mode": "denylist"}},  # BenchFlow: declare the denylist on the sandbox
        {"verifier": {"network_mode": "intranet"}},
    ],
)
def test_a_phase_network_mode_benchflow_refuses_is_refused(raw: dict[str, Any]) -> None:
    with pytest.raises(TaskError, match=r"(agent|verifier)\.network_mode: '(denylist|intranet)'"):
        normalise(raw)


def test_allow_internet_is_the_sandbox_s_only() -> None:
    """``allow_internet`` in a phase is no field of BenchFlow's: reported, not read as a policy."""
    parsed, ignored = spec({"verifier": {"allow_internet": False}})
    assert parsed.networks().verifier == "full"
    assert [field for field, _ in ignored] == ["verifier.allow_internet"]


def test_an_unknown_network_mode_is_refused() -> None:
    with pytest.raises(TaskError, match="network_mode: 'intranet'"):
        normalise({"environment": {"network_mode": "intranet"}})


def test_benchflow_spelling_sandbox_oracle_and_hardening() -> None:
    parsed, ignored = spec(
        {
            "sandbox": {"memory_mb": 1024, "env": {"A": "1"}, "workdir": "/root"},
            "oracle": {"env": {"B": "2"}},
            "verifier": {"hardening": {"cleanup_conftests": False}, "pytest_plugins": ["ctrf"]},
            "agent": {"user": 1000, "prompt_prefix": "Be careful."},
        }
    )
    assert ignored == []
    assert parsed.environment.memory_mb == 1024 and parsed.environment.env == {"A": "1"}
    assert parsed.environment.workdir == "/root"
    assert parsed.solution.env == {"B": "2"}
    assert parsed.verifier.hardening.delete_injected_hooks is False
    assert parsed.verifier.pytest_plugins == ["ctrf"]
    assert parsed.agent.user == "1000"


def test_both_spellings_of_one_section_are_refused() -> None:
    with pytest.raises(TaskError, match="both 'sandbox' and 'environment'"):
        normalise({"sandbox": {}, "environment": {}})


def test_foreign_fields_are_reported_once_with_the_reason_and_defaults_are_not() -> None:
    _, ignored = spec(
        {
            "environment": {
                "gpus": 0,
                "mcp_servers": [],
                "os": "linux",
                "gpus_extra": 1,
                "build_timeout_sec": 600,
            },
            "verifier": {"type": "test-script", "service": "main", "judge": {"model": "m"}},
            "steps": [{"name": "one"}],
            "artifacts": [],
            "frobnicate": True,
        }
    )
    reasons = dict(ignored)
    assert sorted(reasons) == ["environment.gpus_extra", "frobnicate", "steps", "verifier.judge"]
    assert "unknown field" in reasons["frobnicate"] and "multi-step" in reasons["steps"]


def test_a_foreign_field_asking_for_more_is_reported() -> None:
    parsed, ignored = spec({"environment": {"gpus": 2, "storage": "20G"}, "verifier": {"user": "tester"}})
    assert sorted(field for field, _ in ignored) == ["environment.gpus", "verifier.user"]
    assert parsed.environment.storage_mb == 20480  # honoured: the docker sandbox's disk quota


def test_a_typo_in_a_field_of_reroll_is_still_an_error_of_its_type() -> None:
    with pytest.raises(ValueError, match="timeout_sec"):
        spec({"agent": {"timeout_sec": "soon"}})


def test_workdir_must_be_absolute_and_not_root() -> None:
    for workdir in ("relative", "/"):
        with pytest.raises(ValueError, match="workdir must be an absolute path"):
            spec({"environment": {"workdir": workdir}})


def test_prompt_section_and_the_sections_left_out() -> None:
    body = "Intro kept out.\n\n## prompt\n\nDo the thing.\n\n## role:reviewer\n\nReview it.\n"
    prompt, ignored = prompt_of(body)
    assert prompt.strip() == "Do the thing."
    assert [field for field, _ in ignored] == ["## role:reviewer"]
    assert prompt_of("Just a prompt.\n## Notes\nmore") == ("Just a prompt.\n## Notes\nmore", [])


def test_env_templates_resolved_from_the_host() -> None:
    env = {"PLAIN": "x", "FROM_HOST": "${HOME_DIR}", "DEFAULTED": "${MISSING:-fallback}"}
    assert resolve_env(env, {"HOME_DIR": "/h"}, "environment.env") == {
        "PLAIN": "x",
        "FROM_HOST": "/h",
        "DEFAULTED": "fallback",
    }
    with pytest.raises(TaskError, match=r"environment\.env\.X needs the host variable MISSING"):
        resolve_env({"X": "${MISSING}"}, {}, "environment.env")


def test_env_templates_never_pass_the_host_secrets_in() -> None:
    with pytest.raises(TaskError, match="looks like a secret"):
        resolve_env({"KEY": "${OPENAI_API_KEY}"}, {"OPENAI_API_KEY": "sk-x"}, "verifier.env")


def test_skillsbench_inline_solution_env_and_the_image_alias() -> None:
    parsed, ignored = spec(
        {"solution": {"API_URL": "http://x", "env": {"A": "1"}}, "sandbox": {"image": "img:1"}}
    )
    assert parsed.solution.env == {"A": "1", "API_URL": "http://x"}
    assert parsed.environment.docker_image == "img:1" and ignored == []


def test_version_beside_schema_version_is_dropped_as_harbor_does() -> None:
    data, mapped = normalise({"version": "1.0", "schema_version": "1.1", "verifier": {"timeout_sec": 5}})
    assert data["schema_version"] == "1.1" and "version" not in data
    assert ("version", "dropped: schema_version is set") in mapped
    TaskSpec.model_validate(data)
