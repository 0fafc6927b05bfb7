"""Reading the proxy's configuration: one `reroll_contracts.proxy.ProxyConfig` per rollout, from a JSON file.

In a config file the upstream key and the controller's token are given indirectly, as
``"api_key_env": "NAME"`` / ``"controller_token_env": "NAME"`` (the environment variable
holding each), so neither is ever written to disk; `load_config` resolves them. Neither they nor
the agent token are ever logged or recorded.
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
    """Read a JSON config file; ``upstream.api_key_env`` and ``controller_token_env`` name the
    variables holding the upstream key and the controller's token.

    Args:
        path: the JSON file.
        environ: where the variables are looked up (default: ``os.environ``).

    Returns:
        The validated config, with ``upstream.api_key`` and ``controller_token`` resolved.

    Raises:
        ProxyConfigError: the file is missing, not JSON, invalid, or names an unset (or, for the
            controller's token, empty) variable.
    """
    try:
        config = ProxyConfig.model_validate(orjson.loads(path.read_bytes()))
    except OSError as exc:
        raise ProxyConfigError(f"{path}: cannot read the proxy config ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise ProxyConfigError(f"{path}: not JSON ({exc})") from exc
    except ValidationError as exc:
        raise ProxyConfigError(f"{path}: invalid proxy config:\n{exc}") from exc
    env = os.environ if environ is None else environ
    if config.controller_token_env is not None and config.controller_token is None:
        token = _variable(path, env, "controller_token_env", config.controller_token_env)
        if not token:
            raise ProxyConfigError(
                f"{path}: controller_token_env names {config.controller_token_env!r}, which is empty"
            )
        config = config.model_copy(update={"controller_token": token})
    upstream = config.upstream
    if upstream is None or upstream.api_key_env is None or upstream.api_key is not None:
        return config
    resolved = upstream.model_copy(
        update={"api_key": _variable(path, env, "upstream.api_key_env", upstream.api_key_env)}
    )
    return config.model_copy(update={"upstream": resolved})


def _variable(path: Path, environ: Mapping[str, str], field: str, name: str) -> str:
    """The value of the variable `name` that the config's `field` names."""
    if name not in environ:
        raise ProxyConfigError(f"{path}: {field} names {name!r}, which is not set")
    return environ[name]
