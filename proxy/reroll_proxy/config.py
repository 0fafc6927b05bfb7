"""Reading the proxy's configuration: one `reroll_contracts.proxy.ProxyConfig` per rollout, from a JSON file.

In a config file the upstream key is given indirectly as ``"api_key_env": "NAME"`` (the
environment variable holding it), so the key is never written to disk; `load_config` resolves
it. Neither the key nor the agent token is ever logged or recorded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import orjson
from pydantic import ValidationError
from reroll_contracts.errors import ProxyConfigError
from reroll_contracts.proxy import ProxyConfig


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """Read a JSON config file; ``upstream.api_key_env`` names the variable holding the key.

    Args:
        path: the JSON file.
        environ: where ``api_key_env`` is looked up (default: ``os.environ``).

    Returns:
        The validated config, with ``upstream.api_key`` resolved.

    Raises:
        ProxyConfigError: the file is missing, not JSON, invalid, or names an unset variable.
    """
    try:
        config = ProxyConfig.model_validate(orjson.loads(path.read_bytes()))
    except OSError as exc:
        raise ProxyConfigError(f"{path}: cannot read the proxy config ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise ProxyConfigError(f"{path}: not JSON ({exc})") from exc
    except ValidationError as exc:
        raise ProxyConfigError(f"{path}: invalid proxy config:\n{exc}") from exc
    upstream = config.upstream
    if upstream is None or upstream.api_key_env is None or upstream.api_key is not None:
        return config
    env = os.environ if environ is None else environ
    if upstream.api_key_env not in env:
        raise ProxyConfigError(
            f"{path}: upstream.api_key_env names {upstream.api_key_env!r}, which is not set"
        )
    resolved = upstream.model_copy(update={"api_key": env[upstream.api_key_env]})
    return config.model_copy(update={"upstream": resolved})
