"""Read the task configurations of Harbor and benchflow as reroll's own: every field is honoured,
mapped onto one of reroll's, or reported once as ignored — never silently dropped, and a known
foreign field is never an error.

Sources (read in November 2026): Harbor's ``TaskConfig`` (``harbor/models/task/config.py``,
schema 1.1 to 1.4: ``[environment]`` with ``memory``/``storage`` strings, ``allow_internet``,
``network_mode``, ``workdir``, ``[agent] user``, ``[verifier] env``/``user``, ``[solution] env``,
``[[steps]]``, ``artifacts``), which ignores unknown keys; benchflow's ``TaskConfig``
(``benchflow/task/config.py``), which spells the environment ``sandbox`` and the solution
``oracle`` in ``task.md`` front matter and adds ``verifier.hardening.cleanup_conftests``,
``verifier.pytest_plugins``, ``agent.prompt_prefix``, ``sandbox.setup_commands`` and more.

`normalise` turns such a mapping into reroll's spelling (`reroll.tasks.spec.TaskSpec`), `split_ignored`
then takes out every field reroll does not model, with the reason; what stays is validated
strictly (``extra="forbid"``), so a typo in one of reroll's own fields is still reported.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel
from reroll_contracts.childenv import SECRET_NAME
from reroll_contracts.errors import TaskError

SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", re.IGNORECASE)
"""A size as Harbor writes it (``"4G"``, ``"512M"``, ``"1.5Gi"``); the unit is binary (1G = 1024M)."""
MIB_PER_UNIT = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1 / (1024 * 1024)}

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
PHASE_NETWORK_MODES = {"public": "full", "no-network": "none", "allowlist": "none"}
"""Harbor's and benchflow's ``agent.network_mode`` and ``verifier.network_mode`` → reroll's network
policy. An allowlist is ``none`` plus its ``allowed_hosts`` (kept as they are, enforced)."""
NETWORK_MODES = {**PHASE_NETWORK_MODES, "denylist": "full"}
"""benchflow's ``sandbox.network_mode`` (Harbor's ``environment.network_mode``) → reroll's network
policy. A denylist is ``full`` less its ``blocked_hosts`` and ``blocked_urls`` (kept, enforced for
the agent phase: `reroll.tasks.spec.TaskSpec.networks`; URL prefixes through an intercepting
proxy, as BenchFlow checks them)."""

IGNORED: dict[str, tuple[str, tuple[Any, ...]]] = {
    # path: (why reroll ignores it, values that ask for nothing beyond what reroll does anyway)
    "task": ("package metadata (org/name, authors, keywords) is informational", ()),
    "source": ("informational", ()),
    "reward": (
        "task-level reward expressions are not supported: the verifier's reward file is the reward",
        (),
    ),
    "artifacts": ("copying paths out of the sandbox after the run is not supported", ([],)),
    "steps": ("multi-step tasks are not supported: the task runs as one step", (None, [])),
    "multi_step_reward_strategy": ("multi-step tasks are not supported", (None,)),
    "multi_step_reward_mode": ("multi-step tasks are not supported", (None,)),
    "agents": ("task.md roles are not supported: one agent runs the task", ()),
    "scenes": ("task.md scenes are not supported: the prompt is sent once", ()),
    "user": ("task.md simulated users are not supported", ()),
    "benchflow": ("benchflow's authoring block is informational", ()),
    "profile": ("benchflow authoring profiles are not supported", ()),
    "profiles": ("benchflow authoring profiles are not supported", ()),
    "verifier.user": ("the verifier runs as root", (None, "root", 0)),
    "verifier.service": ("the verifier runs in the agent's sandbox", ("main",)),
    "verifier.sandbox_mode": ("the verifier runs in the agent's sandbox", (None, "shared")),
    "verifier.environment_mode": ("the verifier runs in the agent's sandbox", (None, "shared")),
    "verifier.sandbox": ("a separate verifier sandbox is not supported", (None,)),
    "verifier.environment": ("a separate verifier sandbox is not supported", (None,)),
    "verifier.judge": ("read only with verifier.type llm-judge", ()),
    "verifier.memory": ("memory-space scoring is not supported", ()),
    "verifier.reward_range": ("rewards are not range-checked", (None,)),
    "verifier.collect": ("collect hooks are not supported", (None, [])),
    "environment.os": ("reroll's sandboxes are Linux", ("linux", "Linux")),
    "environment.gpus": ("GPUs are not attached", (0, None)),
    "environment.gpu_types": ("GPUs are not attached", (None, [])),
    "environment.tpu": ("TPUs are not attached", (None,)),
    "environment.bugswarm_image_tag": ("informational", (None,)),
    "solution.timeout_sec": ("the oracle agent has the agent's timeout", (None,)),
}
"""Every field of Harbor's and benchflow's schemas that reroll does not model, with the reason.
A value among the harmless ones asks for nothing reroll does not do anyway (``gpus = 0``): it is
not reported."""


def parse_size_mib(value: object, field: str) -> int:
    """A size in MiB from Harbor's string form (``"4G"`` → 4096, ``"512M"`` → 512) or a number of MiB.

    Raises:
        TaskError: not a size (the message names `field`).
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    match = SIZE.fullmatch(str(value))
    if match is None:
        raise TaskError(f"{field}: {value!r} is not a size like '4G' or '512M'")
    return int(float(match.group(1)) * MIB_PER_UNIT[match.group(2).upper()])


def normalise(raw: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """`raw` (a task.toml or task.md front matter) in reroll's spelling, and the mappings made.

    Renames benchflow's ``sandbox`` → ``environment`` and ``oracle`` → ``solution``, ``version``
    → ``schema_version`` (dropped where ``schema_version`` is set too, as Harbor does), the
    ``image`` shorthand → ``environment.docker_image``; converts
    ``memory``/``storage`` strings to ``memory_mb``/``storage_mb`` (the string wins, as in
    Harbor), ``network_mode``/``allow_internet`` to ``network`` in ``environment``, ``agent`` and
    ``verifier`` (`_network_mode`), a numeric
    ``agent.user`` to its string, ``verifier.hardening.cleanup_conftests`` to
    ``delete_injected_hooks``, ``verifier.type`` ``script`` to ``test-script``, an llm-judge's
    ``[verifier.judge]`` to ``verifier.options`` (`reroll.tasks.rubric`), SkillsBench's
    ``[solution] FOO = "..."`` to ``solution.env``, and the package name ``task.name``
    (``org/name``) to ``name`` when the task has none.

    Returns:
        ``(mapping, [(field, what it became)])``; `raw` is not changed.

    Raises:
        TaskError: both spellings of one section, or a bad size.
    """
    data = copy.deepcopy(raw)
    mapped: list[tuple[str, str]] = []
    if "version" in data and "schema_version" in data:  # Harbor keeps schema_version, drops version
        data.pop("version")
        mapped.append(("version", "dropped: schema_version is set"))
    for old, new in (("sandbox", "environment"), ("oracle", "solution"), ("version", "schema_version")):
        if old in data:
            if new in data:
                raise TaskError(f"the task declares both '{old}' and '{new}' (the same section); keep one")
            data[new] = data.pop(old)
            mapped.append((old, new))
    if "image" in data:
        _section(data, "environment").setdefault("docker_image", data.pop("image"))
        mapped.append(("image", "environment.docker_image"))
    if "name" not in data and isinstance(package := data.get("task"), dict) and package.get("name"):
        data["name"] = str(package["name"]).rpartition("/")[2]
        mapped.append(("task.name", "name"))
    environment = _section(data, "environment")
    if "image" in environment:  # benchflow's alias
        environment.setdefault("docker_image", environment.pop("image"))
        mapped.append(("environment.image", "environment.docker_image"))
    for size in ("memory", "storage"):
        if size in environment:
            environment[f"{size}_mb"] = parse_size_mib(environment.pop(size), f"environment.{size}")
            mapped.append((f"environment.{size}", f"environment.{size}_mb"))
    mapped += _network_mode(environment, "environment")
    solution = _section(data, "solution")
    for key in [k for k, v in solution.items() if k not in ("env", "timeout_sec") and isinstance(v, str)]:
        if ENV_NAME.fullmatch(key):  # SkillsBench's [solution] FOO = "..." shorthand (benchflow)
            solution.setdefault("env", {})[key] = solution.pop(key)
            mapped.append((f"solution.{key}", f"solution.env.{key}"))
    agent = _section(data, "agent")
    mapped += _network_mode(agent, "agent")
    mapped += _network_mode(_section(data, "verifier"), "verifier")
    if isinstance(agent.get("user"), int) and not isinstance(agent["user"], bool):
        agent["user"] = str(agent["user"])
    verifier = _section(data, "verifier")
    hardening = verifier.get("hardening")
    if isinstance(hardening, dict) and "cleanup_conftests" in hardening:
        hardening.setdefault("delete_injected_hooks", hardening.pop("cleanup_conftests"))
        mapped.append(("verifier.hardening.cleanup_conftests", "verifier.hardening.delete_injected_hooks"))
    if verifier.get("type") == "script":  # benchflow's name of the test-script strategy
        verifier["type"] = "test-script"
        mapped.append(("verifier.type = script", "verifier.type = test-script"))
    if verifier.get("type") == "llm-judge" and isinstance(judge := verifier.get("judge"), dict):
        verifier["options"] = {**judge, **_section(verifier, "options")}
        del verifier["judge"]
        mapped.append(("verifier.judge", "verifier.options"))
    return data, mapped


def _network_mode(section: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """Turn ``network_mode`` (and, in ``environment``, ``allow_internet``) of `section` (in place)
    into reroll's ``network``; the mappings made. ``network_mode`` wins over ``allow_internet``
    (as in Harbor's ``resolve_baseline`` and benchflow's ``SandboxConfig``), reroll's own ``network``
    over both; a phase (``agent``, ``verifier``) without one inherits ``environment.network``.

    Raises:
        TaskError: an unknown mode, or ``denylist`` on a phase (benchflow refuses it there too).
    """
    modes = NETWORK_MODES if name == "environment" else PHASE_NETWORK_MODES
    mode = section.pop("network_mode", None)
    allow = section.pop("allow_internet", None) if name == "environment" else None
    mapped = []
    if mode is not None:
        if mode not in modes:
            raise TaskError(f"{name}.network_mode: {mode!r} is not one of {', '.join(modes)}")
        section.setdefault("network", modes[mode])
        mapped.append((f"{name}.network_mode", f"{name}.network = {section['network']}"))
    if allow is not None:
        if mode is None:
            section.setdefault("network", "full" if allow else "none")
        mapped.append((f"{name}.allow_internet", f"{name}.network = {section['network']}"))
    return mapped


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    """``data[name]``, stored empty when absent (it validates as the defaults); a detached empty
    mapping when it is not one (validation then reports it)."""
    section = data.setdefault(name, {})
    return section if isinstance(section, dict) else {}


def split_ignored(data: dict[str, Any], model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """Remove from `data` (in place) every field `model` does not declare, recursively through
    its sub-models; return them as ``(dotted path, reason)``.

    A field of `IGNORED` whose value is one of its harmless values is removed without a report.
    Fields neither reroll's nor in `IGNORED` are reported as unknown (Harbor ignores them too).
    """
    ignored: list[tuple[str, str]] = []
    for key in list(data):
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is not None:
            sub = _model_of(field.annotation)
            if sub is not None and isinstance(data[key], dict):
                ignored += split_ignored(data[key], sub, f"{path}.")
            continue
        value = data.pop(key)
        reason, harmless = IGNORED.get(
            path, ("unknown field (not in reroll's, Harbor's or benchflow's task schema)", ())
        )
        if not _harmless(value, harmless):
            ignored.append((path, reason))
    return ignored


def _harmless(value: Any, harmless: tuple[Any, ...]) -> bool:
    return any(
        value == candidate and isinstance(value, bool) == isinstance(candidate, bool)
        for candidate in harmless
    )


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (also inside ``X | None``), else None."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


PROMPT_SECTIONS = re.compile(
    r"^##\s+(prompt|role:[A-Za-z0-9_.-]+|scene:[A-Za-z0-9_.-]+|user-persona)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
"""benchflow's reserved task.md body headings (``benchflow/task/_document_parse.py``)."""


def prompt_of(body: str) -> tuple[str, list[tuple[str, str]]]:
    """The prompt of a task.md body and the sections left out, as benchflow reads it: the
    ``## prompt`` section when there is one, else the text before the first reserved heading
    (all of it when there is none); ``## role:…``, ``## scene:…`` and ``## user-persona``
    sections are reported as ignored.
    """
    matches = list(PROMPT_SECTIONS.finditer(body))
    if not matches:
        return body, []
    sections: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(body)
        sections[match.group(1).lower()] = body[match.end() : end]
    prompt = sections.pop("prompt", body[: matches[0].start()])
    return prompt, [
        (f"## {name}", "task.md roles, scenes and simulated users are not supported") for name in sections
    ]


TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")
"""Harbor's host-variable template in a task's env values: ``${VAR}`` or ``${VAR:-default}``."""


def resolve_env(env: dict[str, str], environ: Mapping[str, str], field: str) -> dict[str, str]:
    """`env` (a task's ``environment.env``, ``verifier.env`` or ``solution.env``) with each value
    that is a template (`TEMPLATE`) replaced by the host's variable, as Harbor resolves them.

    Raises:
        TaskError: a template names a variable the host lacks and gives no default, or one named
            like a secret (a provider key must never reach the sandbox: the LLM proxy holds it).
    """
    resolved: dict[str, str] = {}
    for name, value in env.items():
        match = TEMPLATE.fullmatch(value)
        if match is None:
            resolved[name] = value
            continue
        variable, default = match.group(1), match.group(2)
        if SECRET_NAME.search(variable):
            raise TaskError(
                f"{field}.{name} asks for the host's {variable}, which looks like a secret: reroll never "
                "passes the host's keys into a sandbox (agents reach models through the LLM proxy)"
            )
        if variable in environ:
            resolved[name] = environ[variable]
        elif default is not None:
            resolved[name] = default
        else:
            raise TaskError(f"{field}.{name} needs the host variable {variable}, which is not set")
    return resolved
