"""Model specs: which live upstream answers a rollout's LLM requests.

A model spec is what users pass as ``--model``:

- ``scripted`` — the bundled scripted model with the task's ``scripted-model.yaml``;
- ``scripted:PATH`` — the bundled scripted model with the script at PATH;
- ``scripted-anthropic`` / ``scripted-anthropic:PATH`` — the same, served over Anthropic
  Messages only (``--only-format anthropic-messages``): an agent speaking another API is
  translated at the proxy (`reroll_proxy.translate`);
- ``scripted-responses`` / ``scripted-responses:PATH`` — the same, served over OpenAI
  Responses only (``--only-format openai-responses``);
- ``openai/NAME`` — OpenAI's API (``OPENAI_API_KEY``; ``OPENAI_BASE_URL`` overrides the URL),
  spoken in whatever API the agent speaks;
- ``openai-responses/NAME`` — the same, always over the Responses API (for Responses-only
  models); the proxy translates a Chat or Messages agent;
- ``anthropic/NAME`` — Anthropic's Messages API (``ANTHROPIC_API_KEY``; ``ANTHROPIC_BASE_URL``
  overrides the host, as in Anthropic's SDK: ``/v1`` is appended); the proxy translates
  whatever the agent speaks;
- ``NAME`` with ``REROLL_UPSTREAM_URL`` set — any OpenAI-compatible server at that URL
  (key in ``REROLL_UPSTREAM_API_KEY``, optional).

The agent always talks to the proxy; only the proxy holds the upstream's key.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from reroll_proxy.formats import FormatName

from reroll.errors import ModelError
from reroll.processes import ChildProcess

SCRIPT_FILE_NAME = "scripted-model.yaml"
_SCRIPTED_FORMATS: dict[str, FormatName | None] = {
    "scripted": None,
    "scripted-anthropic": "anthropic-messages",
    "scripted-responses": "openai-responses",
}
"""Scripted model spec prefixes → the one API format the server speaks (None: all of them)."""


@dataclass(frozen=True)
class Upstream:
    """A live endpoint the proxy forwards to."""

    base_url: str
    """Base URL ending in ``/v1``."""
    api_key: str | None
    """The provider key (stays in the proxy)."""
    model: str
    """The model name sent upstream."""
    api_format: FormatName | None = None
    """The API the endpoint speaks; None: whatever the agent speaks (no translation)."""


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


def parse_model(spec: str, task_path: Path | None) -> ModelSpec:
    """Parse a model spec (see the module docstring).

    Raises:
        ModelError: a scripted model without a script file, or an unknown provider without
            ``REROLL_UPSTREAM_URL``.
    """
    kind, colon, path = spec.partition(":")
    if kind in _SCRIPTED_FORMATS:
        script = Path(path) if colon else (task_path or Path()) / SCRIPT_FILE_NAME
        if not script.is_file():
            raise ModelError(f"model {spec!r}: script file {script} not found")
        # An explicit path is stored absolute, so the spec in config.json works from any folder.
        stored = f"{kind}:{script.resolve()}" if colon else spec
        api_format = _SCRIPTED_FORMATS[kind]
        return ModelSpec(spec=stored, name=model_name(spec), script=script.resolve(), api_format=api_format)
    provider = spec.rpartition("/")[0]
    if provider == "anthropic":
        return ModelSpec(spec=spec, name=model_name(spec), api_format="anthropic-messages")
    if provider == "openai-responses":
        return ModelSpec(spec=spec, name=model_name(spec), api_format="openai-responses")
    if provider == "openai" or os.environ.get("REROLL_UPSTREAM_URL"):
        return ModelSpec(spec=spec, name=model_name(spec))
    raise ModelError(
        f"model {spec!r}: unknown provider {provider or '(none)'!r}; use scripted, scripted:PATH, "
        "scripted-anthropic[:PATH], scripted-responses[:PATH], openai/NAME, openai-responses/NAME, "
        "anthropic/NAME, or set REROLL_UPSTREAM_URL for an OpenAI-compatible server"
    )


@contextlib.asynccontextmanager
async def live_upstream(model: ModelSpec, workdir: Path) -> AsyncIterator[Upstream]:
    """Provide the live upstream for `model`, starting the scripted model server when needed.

    Raises:
        ModelError: the provider's key is missing from the environment.
    """
    if model.script is not None:
        only = ["--only-format", model.api_format] if model.api_format else []
        server = ChildProcess(
            "reroll.scripted_model",
            ["--script", str(model.script), *only],
            workdir=workdir,
            name="scripted-model",
        )
        async with server:
            base_url = server.ready["base_url"]
            yield Upstream(base_url=base_url, api_key=None, model=model.name, api_format=model.api_format)
        return
    if model.api_format == "anthropic-messages":
        key = os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ModelError(f"model {model.spec!r} needs ANTHROPIC_API_KEY in the environment")
        host = os.environ.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com").rstrip("/")
        yield Upstream(base_url=f"{host}/v1", api_key=key, model=model.name, api_format=model.api_format)
        return
    if url := os.environ.get("REROLL_UPSTREAM_URL"):
        key = os.environ.get("REROLL_UPSTREAM_API_KEY")
        yield Upstream(base_url=url, api_key=key, model=model.name, api_format=model.api_format)
        return
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        raise ModelError(f"model {model.spec!r} needs OPENAI_API_KEY in the environment")
    base_url = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    yield Upstream(base_url=base_url, api_key=key, model=model.name, api_format=model.api_format)
