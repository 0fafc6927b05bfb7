"""Model specs: which live upstream answers a rollout's LLM requests.

A model spec is what users pass as ``--model``:

- ``scripted`` — the bundled scripted model with the task's script for the agent:
  ``scripted-model.AGENT.yaml`` when the task has one (each agent has its own tools), else
  ``scripted-model.yaml``;
- ``scripted:PATH`` — the bundled scripted model with the script at PATH;
- ``scripted-anthropic`` / ``scripted-anthropic:PATH`` — the same, served over Anthropic
  Messages only (``--only-format anthropic-messages``): an agent speaking another API is
  translated at the proxy (`reroll_proxy.translate`);
- ``scripted-responses`` / ``scripted-responses:PATH`` — the same, served over OpenAI
  Responses only (``--only-format openai-responses``);
- ``scripted-chat`` / ``scripted-chat:PATH`` — the same, served over OpenAI Chat Completions
  only (``--only-format openai-chat``): how an Anthropic agent (Claude Code) is continued by a
  Chat-only model;
- ``openai/NAME`` — OpenAI's API (``OPENAI_API_KEY``; ``OPENAI_BASE_URL`` overrides the URL),
  spoken in whatever API the agent speaks;
- ``openai-responses/NAME`` — the same, always over the Responses API (for Responses-only
  models); the proxy translates a Chat or Messages agent;
- ``anthropic/NAME`` — Anthropic's Messages API (``ANTHROPIC_API_KEY``; ``ANTHROPIC_BASE_URL``
  overrides the host, as in Anthropic's SDK: ``/v1`` is appended); the proxy translates
  whatever the agent speaks;
- ``gemini/NAME`` (or a bare ``gemini-…`` name, as BenchFlow records it) — Google's Gemini over
  its OpenAI-compatible endpoint (``GEMINI_API_KEY``; ``GEMINI_BASE_URL`` overrides the URL),
  spoken in whatever API the agent speaks (the proxy translates Messages / Responses to Chat);
- a bare name as BenchFlow writes it (a task's judge ``model: claude-sonnet-4-6``, a recorded
  run's model) — the provider BenchFlow 0.7.11's judge routing picks from its prefix:
  ``claude-…`` is ``anthropic/…``, ``gpt-…``, ``o1…``, ``o3…``, ``o4…`` are ``openai/…``,
  ``gemini…`` is ``gemini/…``; with ``REROLL_UPSTREAM_URL`` set, a bare ``claude-…`` name goes
  to that server instead, as a bare ``gpt-…`` one does (an ``openai/…`` model prefers it);
- ``PROVIDER/NAME`` with ``PROVIDER_BASE_URL`` set (the provider upper-cased, ``-`` and ``.``
  as ``_``; e.g. ``deepseek/deepseek-chat`` and ``DEEPSEEK_BASE_URL``) — any OpenAI-compatible
  provider (key in ``PROVIDER_API_KEY``, optional): a BenchFlow folder's litellm-style model
  is usable as the live model once its base URL is named;
- ``NAME`` with ``REROLL_UPSTREAM_URL`` set — any OpenAI-compatible server at that URL
  (key in ``REROLL_UPSTREAM_API_KEY``, optional).

The agent always talks to the proxy; only the proxy holds the upstream's key.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from reroll_contracts.errors import ModelError
from reroll_contracts.proxy import FormatName, UpstreamConfig
from reroll_contracts.scripted_admin import SCRIPTS_ROUTE, ScriptAdded, ScriptRegistration

from reroll.host.child_process import ChildProcess
from reroll.host.shared_process import PROXY_MODULE, PROXY_NAME, per_rollout, shared_process

SCRIPT_FILE_NAME = "scripted-model.yaml"
"""A task's script for any agent (the one for agent A, when present: ``scripted-model.A.yaml``)."""
GEMINI_OPENAI_URL = "https://generativelanguage.googleapis.com/v1beta/openai"
"""Google's OpenAI-compatible endpoint for Gemini models (Chat Completions)."""
_PROVIDER_FORMATS: dict[str, FormatName | None] = {
    "anthropic": "anthropic-messages",
    "openai-responses": "openai-responses",
    "openai": None,
    "gemini": "openai-chat",
}
"""Known providers → the one API format they speak (None: whatever the agent speaks)."""
_SCRIPTED_FORMATS: dict[str, FormatName | None] = {
    "scripted": None,
    "scripted-anthropic": "anthropic-messages",
    "scripted-responses": "openai-responses",
    "scripted-chat": "openai-chat",
}
"""Scripted model spec prefixes → the one API format the server speaks (None: all of them)."""


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``--model`` value."""

    spec: str
    """The value as given, with a ``scripted:PATH`` made absolute (stored in config.json)."""
    name: str
    """The model name the agent asks for."""
    script: Path | None = None
    """For the scripted model: the script file."""
    api_format: FormatName | None = None
    """The one API the live model speaks, when it speaks only one (``anthropic/...``,
    ``scripted-anthropic``, ``openai-responses/...``, ``scripted-responses``); None: whatever
    the agent speaks."""


def model_name(spec: str) -> str:
    """The model name an agent asks for under `spec` (``scripted``, or NAME of ``provider/NAME``).

    Unlike `parse_model` this checks nothing, so it works for a recorded run whose provider or
    script is not available here (a replay needs neither).
    """
    return "scripted" if spec.partition(":")[0] in _SCRIPTED_FORMATS else spec.rpartition("/")[2]


def script_file(spec: str) -> Path | None:
    """The script file a ``scripted*:PATH`` spec names (absolute: as `parse_model` stores it,
    relative to this process's folder otherwise); None for any other spec (``scripted`` alone
    reads the task's script, which is in the task folder)."""
    kind, colon, path = spec.partition(":")
    return Path(path).absolute() if kind in _SCRIPTED_FORMATS and colon and path else None


def with_script_file(spec: str, script: Path) -> str:
    """`spec` (a ``scripted*:PATH`` one, `script_file`) naming the script at `script` instead."""
    return f"{spec.partition(':')[0]}:{script}"


def resolved_spec(spec: str | None) -> str | None:
    """`spec` with a ``scripted*:PATH``'s path made absolute and free of links (as `parse_model`
    stores it), so it names the same file from any folder; any other spec (or None) as it is."""
    script = script_file(spec) if spec is not None else None
    return with_script_file(spec, script.resolve()) if spec is not None and script is not None else spec


def model_slug(spec: str | None) -> str:
    """The folder-name form of a model spec (job rollouts, branches), one per spec.

    ``scripted`` stays ``scripted``; ``scripted:/x/fast.yaml`` becomes ``scripted-fast-<hash>``
    and ``openai/gpt-4o`` ``openai-gpt-4o-<hash>``: whatever had to be shortened or replaced
    gets 6 hex digits of the spec's sha256, so two specs never share a folder. None (an agent
    that calls no model) is ``no-model``.
    """
    if spec is None:
        return "no-model"
    kind, colon, path = spec.partition(":")
    readable = f"{kind}-{Path(path).stem}" if colon and kind in _SCRIPTED_FORMATS else spec
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", readable).strip("-")[:40] or "model"
    if slug != spec:
        slug += "-" + hashlib.sha256(spec.encode()).hexdigest()[:6]
    return slug


def check_model(spec: str) -> None:
    """Refuse `spec` now, before anything is written, when no task is needed to tell it cannot
    run (an unknown provider, a missing key, a missing ``scripted:PATH``); a task's own script
    (``scripted`` without a path) is checked with each task.

    Raises:
        ModelError: as `parse_model`.
    """
    kind, colon, _ = spec.partition(":")
    if kind not in _SCRIPTED_FORMATS or colon:
        parse_model(spec, None)


def task_script(task_path: Path | None, agent: str | None) -> Path:
    """The task's scripted-model script for `agent`: ``scripted-model.AGENT.yaml`` when the task
    has one, else ``scripted-model.yaml`` (which may not exist)."""
    folder = task_path or Path()
    own = folder / SCRIPT_FILE_NAME.replace(".yaml", f".{agent}.yaml") if agent else None
    return own if own is not None and own.is_file() else folder / SCRIPT_FILE_NAME


def parse_model(spec: str, task_path: Path | None, agent: str | None = None) -> ModelSpec:
    """Parse a model spec (see the module docstring); `agent` picks the task's script for it.

    Raises:
        ModelError: a scripted model without a script file, an unknown provider without
            ``REROLL_UPSTREAM_URL``, or a provider whose key is missing from the environment.
    """
    kind, colon, path = spec.partition(":")
    if kind in _SCRIPTED_FORMATS:
        script = Path(path) if colon else task_script(task_path, agent)
        if not script.is_file():
            raise ModelError(f"model {spec!r}: script file {script} not found")
        # An explicit path is stored absolute, so the spec in config.json works from any folder.
        stored = f"{kind}:{script.resolve()}" if colon else spec
        api_format = _SCRIPTED_FORMATS[kind]
        return ModelSpec(spec=stored, name=model_name(spec), script=script.resolve(), api_format=api_format)
    provider = provider_of(spec)
    known = provider in _PROVIDER_FORMATS or (provider and os.environ.get(provider_env(provider, "BASE_URL")))
    if known or os.environ.get("REROLL_UPSTREAM_URL"):
        model = ModelSpec(spec=spec, name=model_name(spec), api_format=_PROVIDER_FORMATS.get(provider))
        _endpoint(model)  # a missing key is refused now, before anything is written
        return model
    raise ModelError(
        f"model {spec!r}: unknown provider {provider or '(none)'!r}; use scripted, scripted:PATH, "
        "scripted-anthropic[:PATH], scripted-responses[:PATH], scripted-chat[:PATH], openai/NAME, "
        "openai-responses/NAME, anthropic/NAME, gemini/NAME, a bare claude-/gpt-/o1/o3/o4/gemini name, "
        "PROVIDER/NAME with PROVIDER_BASE_URL set, or set REROLL_UPSTREAM_URL for an OpenAI-compatible server"
    )


_BARE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("claude-", "anthropic"),
    ("gpt-", "openai"),
    ("o1", "openai"),
    ("o3", "openai"),
    ("o4", "openai"),
    ("gemini", "gemini"),
)
"""A bare model name's prefix → the provider BenchFlow 0.7.11 routes it to (its judge's
prefix routing, which its simulated User shares)."""


def provider_of(spec: str) -> str:
    """The provider part of a provider model spec: ``PROVIDER`` of ``PROVIDER/NAME``; for a
    bare name, the provider BenchFlow picks from its prefix (`_BARE_PREFIXES`: ``anthropic`` of
    ``claude-sonnet-4-6`` unless ``REROLL_UPSTREAM_URL`` is set, ``openai`` of ``gpt-4o``,
    ``gemini`` of ``gemini-3-pro``); "" for another bare name."""
    provider = spec.rpartition("/")[0]
    if provider:
        return provider
    bare = next((name for prefix, name in _BARE_PREFIXES if spec.startswith(prefix)), "")
    return "" if bare == "anthropic" and os.environ.get("REROLL_UPSTREAM_URL") else bare


def provider_env(provider: str, suffix: str) -> str:
    """The environment variable of `provider` ending in `suffix`: ``provider_env("my-llm",
    "BASE_URL")`` is ``MY_LLM_BASE_URL``."""
    return re.sub(r"[^A-Za-z0-9]", "_", provider).upper() + "_" + suffix


@contextlib.asynccontextmanager
async def live_upstream(model: ModelSpec, workdir: Path) -> AsyncIterator[UpstreamConfig]:
    """Provide the live upstream for `model`: a scripted model is served by the controller's
    shared LLM proxy's process (`reroll.host.shared_process`; its script added on its admin
    channel), or by a process of its own under ``REROLL_PROXY=per-rollout``.

    The upstream's ``api_key`` is the provider key (it stays in the proxy, see `reroll.host.llm_proxy`).

    Raises:
        ModelError: the provider's key is missing from the environment.
    """
    if model.script is not None and not per_rollout():
        shared = await shared_process(PROXY_MODULE, PROXY_NAME)
        shared.acquire()
        try:
            registration = ScriptRegistration(script=model.script, only_format=model.api_format)
            added = await shared.post(SCRIPTS_ROUTE, registration, ScriptAdded)
            try:
                yield UpstreamConfig(base_url=added.base_url, model=model.name, api_format=model.api_format)
            finally:
                await shared.delete(f"{SCRIPTS_ROUTE}/{added.script_id}")
        finally:
            shared.release()
        return
    if model.script is not None:
        only = ["--only-format", model.api_format] if model.api_format else []
        server = ChildProcess(
            "reroll_proxy.scripted",
            ["--script", str(model.script), *only],
            workdir=workdir,
            name="scripted-model",
        )
        async with server:
            base_url = server.ready.address
            yield UpstreamConfig(base_url=base_url, model=model.name, api_format=model.api_format)
        return
    base_url, key = _endpoint(model)
    yield UpstreamConfig(base_url=base_url, api_key=key, model=model.name, api_format=model.api_format)


def _endpoint(model: ModelSpec) -> tuple[str, str | None]:
    """The base URL and key of provider model `model`, from the environment (see the module docstring).

    Raises:
        ModelError: the provider's key is missing from the environment.
    """
    if model.api_format == "anthropic-messages":
        key = os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ModelError(f"model {model.spec!r} needs ANTHROPIC_API_KEY in the environment")
        return os.environ.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com").rstrip("/") + "/v1", key
    provider = provider_of(model.spec)
    if provider == "gemini":
        if not (key := os.environ.get("GEMINI_API_KEY")):
            raise ModelError(f"model {model.spec!r} needs GEMINI_API_KEY in the environment")
        return os.environ.get("GEMINI_BASE_URL", GEMINI_OPENAI_URL), key
    if (
        provider
        and provider not in _PROVIDER_FORMATS
        and (url := os.environ.get(provider_env(provider, "BASE_URL")))
    ):
        return url, os.environ.get(provider_env(provider, "API_KEY"))
    if url := os.environ.get("REROLL_UPSTREAM_URL"):
        return url, os.environ.get("REROLL_UPSTREAM_API_KEY")
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        raise ModelError(f"model {model.spec!r} needs OPENAI_API_KEY in the environment")
    return os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"), key
