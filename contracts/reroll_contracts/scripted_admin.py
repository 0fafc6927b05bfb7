"""The admin protocol of a shared scripted model server (`reroll_proxy.scripted.SharedScripts`):
what the controller posts to serve one more script, and the answer.

Its own module so that the controller (`reroll.models.spec.live_upstream`) registers scripts
without loading the server's module and its aiohttp.web.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from reroll_contracts.proxy import FormatName

SCRIPTS_ROUTE = "/_reroll/scripts"
"""A shared scripted model's admin route."""


class ScriptRegistration(BaseModel):
    """What the controller sends a shared scripted model (``POST /_reroll/scripts``, with its
    admin token) to serve one more script."""

    model_config = ConfigDict(extra="forbid")
    script: Path
    """The script file (YAML or JSON)."""
    only_format: FormatName | None = None
    """Serve only this API format (see `reroll_proxy.scripted.ScriptServer`)."""


class ScriptAdded(BaseModel):
    """A shared scripted model's answer to a `ScriptRegistration`."""

    model_config = ConfigDict(extra="forbid")
    script_id: str
    """Names it in ``DELETE /_reroll/scripts/{script_id}`` and in its base URL."""
    base_url: str
    """Where its requests go: ``http://HOST:PORT/<script_id>/v1``."""
