"""The environment plane's task fields: services, health checks, state and MCP servers validate as
benchflow's manifest and task config define them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from reroll.tasks.environment import HealthCheck, McpServerSpec, ServiceSpec, StateSpec, start_order
from reroll.tasks.spec import EnvironmentSection


def test_services_start_after_their_dependencies() -> None:
    environment = EnvironmentSection.model_validate(
        {
            "services": [
                {"name": "api", "command": "serve-api", "port": 9001, "depends_on": ["db"]},
                {"name": "db", "command": "serve-db", "port": 5432},
                {"name": "worker", "command": "work"},
            ]
        }
    )
    assert [service.name for service in start_order(environment.services)] == ["db", "api", "worker"]


@pytest.mark.parametrize(
    ("services", "message"),
    [
        ([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}], "declared twice: a"),
        ([{"name": "a", "command": "x", "depends_on": ["b"]}], "unknown services: b"),
        (
            [
                {"name": "a", "command": "x", "depends_on": ["b"]},
                {"name": "b", "command": "y", "depends_on": ["a"]},
            ],
            "cycle: a -> b -> a",
        ),
        ([{"name": "Web Server", "command": "x"}], "DNS label"),
        ([{"name": "a"}], "neither 'command' nor 'image' nor 'build'"),
        (
            [{"name": "a", "build": {"context": "x", "dockerfile": "../Dockerfile"}}],
            "inside the build context",
        ),
        ([{"name": "a", "build": {"context": "x", "dockerfile": "/Dockerfile"}}], "inside the build context"),
    ],
)
def test_bad_services_are_refused_with_the_cause(services: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EnvironmentSection.model_validate({"services": services})


def test_owns_lifecycle_excludes_declared_services() -> None:
    with pytest.raises(ValidationError, match="owns_lifecycle"):
        EnvironmentSection.model_validate(
            {"owns_lifecycle": True, "services": [{"name": "a", "command": "x"}]}
        )


def test_a_health_check_has_exactly_one_probe() -> None:
    assert HealthCheck(http="/health").http == "/health"
    with pytest.raises(ValidationError, match="exactly one"):
        HealthCheck(command="true", http="/health")
    with pytest.raises(ValidationError, match="exactly one"):
        HealthCheck()


def test_state_kinds_need_what_they_capture() -> None:
    assert StateSpec(kind="sqlite", paths=["/data/mail.db"]).paths == ["/data/mail.db"]
    with pytest.raises(ValidationError, match="needs 'paths'"):
        StateSpec(kind="files")
    with pytest.raises(ValidationError, match="absolute"):
        StateSpec(kind="files", paths=["data"])
    with pytest.raises(ValidationError, match="snapshot_command"):
        StateSpec(kind="command", snapshot_command="dump")


def test_mcp_servers_as_benchflow_spells_them() -> None:
    http = McpServerSpec.model_validate({"name": "mail", "transport": "http", "url": "http://mail:9001/mcp"})
    assert http.transport == "streamable-http"
    assert McpServerSpec(name="mail", transport="stdio", command="mail-mcp").args == []
    with pytest.raises(ValidationError, match="needs 'url'"):
        McpServerSpec(name="mail")
    with pytest.raises(ValidationError, match="needs 'command'"):
        McpServerSpec(name="mail", transport="stdio")


def test_mcp_tool_filters_as_benchflow_checks_them() -> None:
    """Entries stripped, blank ones dropped, an empty filter refused (it would offer nothing)."""
    server = McpServerSpec(
        name="mail",
        url="http://mail/sse",
        tools=[" read ", ""],
        include_tags=["inbox"],
        exclude_tags=["admin"],
    )
    assert server.filters == {"tools": ["read"], "include_tags": ["inbox"], "exclude_tags": ["admin"]}
    assert McpServerSpec(name="mail", url="http://mail/sse").filters == {}
    for field in ("tools", "include_tags", "exclude_tags"):
        with pytest.raises(ValidationError, match="needs at least one name"):
            McpServerSpec.model_validate({"name": "mail", "url": "http://mail/sse", field: [" ", ""]})


def test_a_service_without_health_check_keeps_the_manifest_health_path() -> None:
    service = ServiceSpec(name="gmail", command="claw-gmail serve --port 9001", port=9001)
    assert (service.health, service.health_path) == (None, "/health")
