"""Model specs: which live upstream answers a rollout's LLM requests.

A model spec is what users pass as ``--model``:

- ``scripted`` — the bundled scripted model with the task's ``scripted-model.yaml``;
- ``scripted:PATH`` — the bundled scripted model with the script at PATH;
- ``openai/NAME`` — OpenAI's API (``OPENAI_API_KEY``; ``OPENAI_BASE_URL`` overrides the URL);
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

from reroll.errors import ModelError
from reroll.processes import ChildProcess

SCRIPT_FILE_NAME = "scripted-model.yaml"


@dataclass(frozen=True)
class Upstream:
    """A live OpenAI-compatible endpoint the proxy forwards to."""

    base_url: str
    """Base URL ending in ``/v1``."""
    api_key: str | None
    """The provider key (stays in the proxy)."""
    model: str
    """The model name sent upstream."""


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``--model`` value."""

    spec: str
    """The value as given, with a ``scripted:PATH`` made absolute (stored in config.json)."""
    name: str
    """The model name the agent asks for."""
    script: Path | None = None
    """For the scripted model: the script file."""


def model_name(spec: str) -> str:
    """The model name an agent asks for under `spec` (``scripted``, or NAME of ``provider/NAME``).

    Unlike `parse_model` this checks nothing, so it works for a recorded run whose provider or
    script is not available here (a replay needs neither).
    """
    return "scripted" if spec == "scripted" or spec.startswith("scripted:") else spec.rpartition("/")[2]


def parse_model(spec: str, task_path: Path | None) -> ModelSpec:
    """Parse a model spec (see the module docstring).

    Raises:
        ModelError: a scripted model without a script file, or an unknown provider without
            ``REROLL_UPSTREAM_URL``.
    """
    if spec == "scripted" or spec.startswith("scripted:"):
        script = Path(spec.partition(":")[2]) if ":" in spec else (task_path or Path()) / SCRIPT_FILE_NAME
        if not script.is_file():
            raise ModelError(f"model {spec!r}: script file {script} not found")
        # An explicit path is stored absolute, so the spec in config.json works from any folder.
        stored = f"scripted:{script.resolve()}" if ":" in spec else spec
        return ModelSpec(spec=stored, name=model_name(spec), script=script.resolve())
    provider = spec.rpartition("/")[0]
    if provider == "openai" or os.environ.get("REROLL_UPSTREAM_URL"):
        return ModelSpec(spec=spec, name=model_name(spec))
    raise ModelError(
        f"model {spec!r}: unknown provider {provider or '(none)'!r}; use scripted, scripted:PATH, "
        "openai/NAME, or set REROLL_UPSTREAM_URL for an OpenAI-compatible server"
    )


@contextlib.asynccontextmanager
async def live_upstream(model: ModelSpec, workdir: Path) -> AsyncIterator[Upstream]:
    """Provide the live upstream for `model`, starting the scripted model server when needed.

    Raises:
        ModelError: the provider's key is missing from the environment.
    """
    if model.script is not None:
        server = ChildProcess(
            "reroll.scripted_model", ["--script", str(model.script)], workdir=workdir, name="scripted-model"
        )
        async with server:
            yield Upstream(base_url=server.ready["base_url"], api_key=None, model=model.name)
        return
    if url := os.environ.get("REROLL_UPSTREAM_URL"):
        yield Upstream(base_url=url, api_key=os.environ.get("REROLL_UPSTREAM_API_KEY"), model=model.name)
        return
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        raise ModelError(f"model {model.spec!r} needs OPENAI_API_KEY in the environment")
    base_url = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    yield Upstream(base_url=base_url, api_key=key, model=model.name)
