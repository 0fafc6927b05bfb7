"""Where a task's environment plane comes from besides its own configuration: BenchFlow's
``environment.toml`` manifest and Harbor's ``environment/docker-compose.yaml``.

**The manifest** (BenchFlow's ``EnvironmentManifest``, ``src/benchflow/environment/manifest.py``
and ``docs/environment-plane.md``, read in November 2026) is read as it is: its ``[environment]``
table (``.toml``; an ``environment:`` mapping in ``.yaml``/``.yml``) from the file task.md's front
matter pins with ``benchflow: {environment: {manifest: PATH}}`` (relative to the task folder;
``../environment.toml`` shares one between a benchmark's tasks), else from ``environment.toml``
in the task folder. `apply_manifest` merges it under the task's own ``environment`` (``sandbox``)
section, whose fields win. Field by field:

- ``image`` → ``environment.docker_image`` (a ready-to-run image, chi-bench);
- ``base_image`` → ``environment.docker_image`` when the task has no ``environment/Dockerfile``;
  with one, the Dockerfile builds ``FROM`` it (smolclaws) and it is informational;
- ``owns_lifecycle`` defaults to true in a manifest (BenchFlow's default; false in a task's own
  section); ``owns_lifecycle = false`` needs ``[[environment.services]]``, as BenchFlow checks;
- ``task_selection``, ``readiness``, ``forward_env``, ``state``, ``services`` as they are (reroll's
  models are supersets of BenchFlow's, `reroll.tasks.environment`); a command service of a
  manifest starts only where its program is installed (``if_installed``: one manifest serves
  per-task images that carry a subset of its services, and BenchFlow probes and skips);
- ``name``: informational (the task's own name selects the task);
- ``ports``, ``keep_alive``, ``isolation`` as they are (`reroll.tasks.spec.EnvironmentSection`):
  ``ports`` with the services' own are the environment's endpoints on the sandbox's localhost
  (nothing is published to the host); ``keep_alive = false`` lets a service exit once ready;
  ``isolation = "persistent"`` runs with a fresh environment per rollout, as ``per_task``, and
  the notes say so (`PERSISTENT_NOTE`).

**Harbor's compose file** (``environment/docker-compose.yaml``, the compose specification) is
parsed here with PyYAML into `ServiceSpec` s rather than run by Docker Compose: reroll makes the
rollout's own container itself (its sidecar as entrypoint, its sized volumes, network and
firewall), which Compose would not, and the engine here has no compose plugin. The service named
``main`` (Harbor's; in a file without one, the first service that ``build``s) is the sandbox
itself: its ``build`` (``context``, ``dockerfile``) says where the sandbox's image is built from
(``environment.build``; the default, ``.`` or Harbor's ``${CONTEXT_DIR}``, is ``environment/`` and
its Dockerfile); its ``environment`` is the sandbox's ``environment.env`` (under the task's own),
its ``depends_on`` holds (services are healthy before the agent starts) and its other keys
(``volumes`` named with the services sharing them, ``ports`` …) are reported as not applied.
Every other service becomes a sibling container on docker: ``image`` or ``build``
(its image built by reroll, as the sandbox's is: images cannot be pulled everywhere), ``command``,
``entrypoint``, ``environment``, ``depends_on``, ``healthcheck`` (``test``, ``interval``,
``timeout``, ``start_period``, ``retries``) and ``working_dir`` are honoured, the rest (``ports``,
``volumes``, ``networks``, ``build.args`` …) reported as ignored. Build contexts are relative to
the compose file's folder, as in Compose, and may lie outside the task (a folder shared by tasks);
they must exist when the task loads.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from reroll_contracts.errors import TaskError

MANIFEST_FILE = "environment.toml"
"""A manifest in the task folder is loaded when task.md pins none."""
PERSISTENT_NOTE = (
    "runs as per_task: every rollout starts from the task's own baseline in a sandbox of its own; "
    "state is not carried from one rollout to the next (a replay, a branch and parallel rollouts "
    "each need their start to be the recorded one, not whatever another rollout left)"
)
"""What becomes of ``isolation = "persistent"`` (`task check`, the run's console)."""
COMPOSE_HONOURED = {
    "image",
    "build",
    "command",
    "entrypoint",
    "environment",
    "depends_on",
    "healthcheck",
    "working_dir",
}
"""Keys of a compose service `compose_services` maps; the others are reported as ignored."""
BUILD_HONOURED = {"context", "dockerfile"}
"""Keys of a compose ``build`` mapping `compose_services` honours; the others are reported as ignored."""
MAIN_SERVICE = "main"
"""The compose service that is the sandbox (Harbor's name)."""
CONTEXT_VARIABLES = ("${CONTEXT_DIR}", "$CONTEXT_DIR")
"""Harbor's name for the ``environment/`` folder in a compose ``build.context``."""
DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)")
"""One part of a compose duration (``1m30s``, ``500ms``)."""
SECONDS_PER_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

Notes = list[tuple[str, str]]
"""``[(dotted field, what became of it)]``, as `reroll.tasks.task.Task.mapped` / ``ignored``."""


REGISTRY_VARIABLE = "BENCHFLOW_ENV_REGISTRY"
"""The folder of named manifests (``NAME.toml``, ``NAME@VERSION.toml``, ``.yaml``/``.yml`` too) a
run's ``--environment-manifest NAME[@VERSION]`` or ``--state`` is looked up in (BenchFlow's)."""
MANIFEST_SUFFIXES = (".toml", ".yaml", ".yml")
REGISTRY_SPEC = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<version>[A-Za-z0-9][A-Za-z0-9._-]*))?"
)
"""``name`` or ``name@version``, no path separator (BenchFlow's registry spec)."""


def resolve_manifest(spec: str, environ: Mapping[str, str] | None = None) -> Path:
    """The manifest file a run's ``--environment-manifest`` names: `spec` itself when it is a
    file, else ``name`` / ``name@version`` in the registry folder ``$BENCHFLOW_ENV_REGISTRY``
    (`REGISTRY_VARIABLE`): ``name@version.toml`` (or ``.yaml``/``.yml``); for a bare name
    ``name.toml``, else the last ``name@*`` in name order. BenchFlow's built-in registry (its
    ``env0`` worlds) is BenchFlow's data and not shipped with reroll.

    Raises:
        TaskError: no such file, not a spec, no registry set, or no such manifest in it (the
            names it holds listed).
    """
    path = Path(spec).expanduser()
    if path.is_file():
        return path.resolve()
    match = REGISTRY_SPEC.fullmatch(spec)
    if match is None:
        raise TaskError(f"environment manifest {spec}: no such file, and not a NAME[@VERSION] of a registry")
    folder = (os.environ if environ is None else environ).get(REGISTRY_VARIABLE, "")
    if not folder:
        raise TaskError(
            f"environment manifest {spec}: no such file; a NAME[@VERSION] is looked up in the folder "
            f"${REGISTRY_VARIABLE} names, which is not set"
        )
    registry = Path(folder).expanduser()
    name, version = match.group("name"), match.group("version")
    stems = [f"{name}@{version}"] if version else [name]
    found = [registry / f"{stem}{suffix}" for stem in stems for suffix in MANIFEST_SUFFIXES]
    if not version:
        found += sorted(p for suffix in MANIFEST_SUFFIXES for p in registry.glob(f"{name}@*{suffix}"))[-1:]
    for candidate in found:
        if candidate.is_file():
            return candidate.resolve()
    held = sorted({p.stem for suffix in MANIFEST_SUFFIXES for p in registry.glob(f"*{suffix}")})
    raise TaskError(
        f"environment manifest {spec}: not in the registry {registry} (${REGISTRY_VARIABLE}); "
        f"it holds: {', '.join(held) or 'nothing'}"
    )


def parse_state(value: str, environ: Mapping[str, str] | None = None) -> tuple[Path, tuple[str, ...] | None]:
    """A run's ``--state`` (BenchFlow's): inline JSON ``{"name": SPEC, "tools": [SERVICE, ...]}``
    (the manifest `resolve_manifest` finds for SPEC, and only those of its services started), or
    a SPEC alone. Returns the manifest file and the services kept (None: all).

    Raises:
        TaskError: not JSON of that shape, or as `resolve_manifest`.
    """
    text = value.strip()
    if not text.startswith("{"):
        return resolve_manifest(text, environ), None
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(f"--state: invalid JSON: {exc}") from exc
    tools = given.get("tools") if isinstance(given, dict) else None
    if not isinstance(given, dict) or not isinstance(given.get("name"), str):
        raise TaskError(
            '--state: a JSON object with a "name" is expected, e.g. {"name": "env0", "tools": ["gmail"]}'
        )
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise TaskError('--state: "tools" must be a list of service names')
    return resolve_manifest(given["name"], environ), tuple(tools) if tools else None


def pinned_manifest(raw: dict[str, Any], task_dir: Path) -> Path | None:
    """The manifest `raw` (task.md front matter or task.toml) pins with ``benchflow.environment
    .manifest`` (taken out of `raw`), else ``environment.toml`` in `task_dir`, else None.

    Raises:
        TaskError: the pinned path is not a string or names no file.
    """
    block = raw.get("benchflow")
    environment = block.get("environment") if isinstance(block, dict) else None
    pin = environment.pop("manifest", None) if isinstance(environment, dict) else None
    if isinstance(block, dict):
        if environment == {}:
            block.pop("environment")
        if not block:
            raw.pop("benchflow")
    if pin is None:
        default = task_dir / MANIFEST_FILE
        return default if default.is_file() else None
    if not isinstance(pin, str):
        raise TaskError(f"benchflow.environment.manifest: {pin!r} is not a path")
    path = task_dir / pin
    if not path.is_file():
        raise TaskError(f"benchflow.environment.manifest: {pin} names no file (looked at {path})")
    return path


def read_manifest(path: Path) -> dict[str, Any]:
    """The ``environment`` table of the manifest at `path` (TOML; YAML for ``.yaml``/``.yml``).

    Raises:
        TaskError: it cannot be read or parsed, or has no ``environment`` table (the file named).
    """
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise TaskError(f"{path}: the environment manifest does not load: {exc}") from exc
    environment = data.get("environment") if isinstance(data, dict) else None
    if not isinstance(environment, dict):
        raise TaskError(f"{path}: an environment manifest needs an [environment] table")
    return environment


def apply_manifest(raw: dict[str, Any], manifest: Path, has_dockerfile: bool) -> tuple[Notes, Notes]:
    """Merge the manifest at `manifest` under `raw`'s environment section (``sandbox`` or
    ``environment``; `raw` changed in place), the task's own fields winning; see the module
    docstring for each field.

    Returns:
        ``(mapped, ignored)`` notes, fields named ``manifest.<field>``.

    Raises:
        TaskError: as `read_manifest`; neither ``image`` nor ``base_image``, or ``owns_lifecycle
            = false`` without services (BenchFlow's rules), the file named.
    """
    table = dict(read_manifest(manifest))
    where = f"manifest {manifest.name}"
    mapped: Notes = [("benchflow.environment.manifest", f"{where}: its [environment] under the task's")]
    ignored: Notes = []
    image, base_image = table.pop("image", None), table.pop("base_image", None)
    if not image and not base_image:
        raise TaskError(f"{manifest}: the manifest must set either 'image' or 'base_image'")
    table.setdefault("owns_lifecycle", True)
    if table["owns_lifecycle"] is False and not table.get("services"):
        raise TaskError(
            f"{manifest}: owns_lifecycle = false needs [[environment.services]]: something has to start them"
        )
    if table["owns_lifecycle"] is False:  # BenchFlow probes each and starts those installed
        for service in table.get("services") or []:
            if isinstance(service, dict) and not {"image", "build"} & service.keys():
                service.setdefault("if_installed", True)
    if "name" in table:
        mapped.append(
            ("manifest.name", f"informational ({table.pop('name')}): the task's own name selects it")
        )
    if table.get("isolation") == "persistent":
        ignored.append(("manifest.isolation", f"persistent {PERSISTENT_NOTE}"))
    if image:
        table["docker_image"] = image
        mapped.append(("manifest.image", "environment.docker_image"))
    elif has_dockerfile:
        mapped.append(("manifest.base_image", "informational: environment/Dockerfile builds the image"))
    else:
        table["docker_image"] = base_image
        mapped.append(("manifest.base_image", "environment.docker_image"))
    section = "sandbox" if "sandbox" in raw else "environment"
    own = raw.get(section)
    if own is None:
        own = {}
    if not isinstance(own, dict):
        raise TaskError(f"{section}: a mapping is expected, not {type(own).__name__}")
    if "docker_image" in table and ("image" in own or "docker_image" in own or "image" in raw):
        table.pop("docker_image")  # the task names its own image
    raw[section] = table | own
    return mapped, ignored


def compose_services(
    path: Path,
) -> tuple[list[dict[str, Any]], dict[str, str] | None, dict[str, str], Notes, Notes]:
    """The services of Harbor's compose file at `path` as ``[[environment.services]]`` entries
    (mappings `ServiceSpec` validates), the sandbox's own build, and notes; see the module docstring.

    Returns:
        ``(services, build, env, mapped, ignored)``: `build` is the sandbox's ``environment.build``
        mapping (an absolute context) when the main service builds from elsewhere than
        ``environment/`` and its Dockerfile, else None; `env` the main service's ``environment``
        (the sandbox's ``environment.env`` under the task's own); fields named
        ``docker-compose.services.<name>[.<key>]``.

    Raises:
        TaskError: the file does not parse, has no ``services`` mapping, a service has neither
            ``build`` nor ``image``, or a ``build`` names a context folder or Dockerfile that does
            not exist (the file and service named).
    """
    services, main = _load_compose(path)
    result: list[dict[str, Any]] = []
    sandbox_build: dict[str, str] | None = None
    main_env: dict[str, str] = {}
    mapped: Notes = []
    ignored: Notes = []
    for name, body in services.items():
        field = f"docker-compose.services.{name}"
        if not isinstance(body, dict):
            raise TaskError(f"{path}: service {name!r} is not a mapping")
        build, unapplied = _compose_build(body["build"], path, str(name)) if "build" in body else (None, [])
        ignored += [
            (f"{field}.build.{key}", "not applied: only context and dockerfile are") for key in unapplied
        ]
        own = {"context": str(path.parent.resolve()), "dockerfile": "Dockerfile"}
        if build is not None and not (name == main and build == own):
            dockerfile = Path(build["context"]) / build["dockerfile"]
            if not dockerfile.is_file():
                raise TaskError(f"{path}: service {name!r}: build.dockerfile: no such file {dockerfile}")
        if name == main:
            where = "environment/Dockerfile"
            if build is not None and build != own:
                sandbox_build, where = build, f"{build['dockerfile']} in {_shown(build, path)}"
            mapped.append((field, f"the sandbox itself (built from {where})"))
            main_env, main_mapped, main_ignored = _main_extras(body, services, path, str(name))
            mapped += main_mapped
            ignored += main_ignored
            continue
        spec, runs = _sibling_spec(body, path, str(name), build)
        result.append(spec)
        mapped.append((field, f"environment.services {name} ({runs}, a sibling container)"))
        ignored += [
            (
                f"{field}.{key}",
                "compose options beyond image, build, command, entrypoint, environment, depends_on, "
                "healthcheck and working_dir are not applied (the rollout's limits and network are)",
            )
            for key in body
            if key not in COMPOSE_HONOURED
        ]
    return result, sandbox_build, main_env, mapped, ignored


def _load_compose(path: Path) -> tuple[dict[Any, Any], Any]:
    """The ``services`` mapping of the compose file at `path`, and the name of its main service
    (`MAIN_SERVICE`, else the first that builds; None when none does).

    Raises:
        TaskError: the file does not parse, or has no ``services`` mapping.
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TaskError(f"{path}: the compose file does not load: {exc}") from exc
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict):
        raise TaskError(f"{path}: a compose file needs a 'services' mapping")
    main = MAIN_SERVICE if MAIN_SERVICE in services else None
    if main is None:
        main = next(
            (name for name, body in services.items() if isinstance(body, dict) and "build" in body), None
        )
    return services, main


def _sibling_spec(
    body: dict[str, Any], path: Path, name: str, build: dict[str, str] | None
) -> tuple[dict[str, Any], str]:
    """A sibling service's ``[[environment.services]]`` entry from its compose `body`, and what it
    runs (in words, for the notes).

    Raises:
        TaskError: it has neither ``build`` nor ``image``, or an option it keeps is invalid.
    """
    if build is None and not body.get("image"):
        raise TaskError(f"{path}: service {name!r} has neither 'build' nor 'image'")
    spec: dict[str, Any] = {"name": name}
    if build is not None:
        spec["build"] = build
        runs = f"built from {build['dockerfile']} in {_shown(build, path)}"
    else:
        spec["image"] = str(body["image"])
        runs = f"image {body['image']}"
    if "command" in body or "entrypoint" in body:
        spec["command"] = _shell_line(body.get("entrypoint"), body.get("command"))
    if body.get("environment"):
        spec["env"] = _compose_env(body["environment"], path, name)
    if body.get("depends_on"):
        depends = body["depends_on"]
        spec["depends_on"] = list(depends) if isinstance(depends, dict | list) else [depends]
    if body.get("working_dir"):
        spec["workdir"] = str(body["working_dir"])
    if isinstance(check := body.get("healthcheck"), dict) and not check.get("disable"):
        health = _compose_health(check, path, name)
        if health is not None:
            spec["health"] = health
    return spec, runs


def _main_extras(
    body: dict[str, Any], services: dict[str, Any], path: Path, name: str
) -> tuple[dict[str, str], Notes, Notes]:
    """What the sandbox's own compose service declares beyond its ``build`` (issue 29, item 10).

    Args:
        body: the sandbox's compose service.
        services: every service of the compose file (to name those sharing a volume with it).
        path: the compose file, named in errors.
        name: the sandbox's service name (``main``).

    Returns:
        ``(env, mapped, ignored)``: `env` its ``environment`` (the sandbox's ``environment.env``
        below the task's own), and notes for ``task check``: every other key is reported as not
        applied, a named volume with the services that share it.

    Raises:
        TaskError: the ``environment`` is neither a mapping nor a list of ``KEY=VALUE``.
    """
    field = f"docker-compose.services.{name}"
    env = _compose_env(body["environment"], path, name) if body.get("environment") else {}
    mapped: Notes = [(f"{field}.environment", "environment.env (the task's own env wins)")] if env else []
    ignored: Notes = []
    for key in body:
        if key in {"build", "image", "environment", "depends_on"}:  # services start before the agent
            continue
        note = "not applied to the sandbox (the rollout's own limits, network and mounts are)"
        if key == "volumes":
            note = f"not applied: {_shared_volumes(body, services, name)}"
        ignored.append((f"{field}.{key}", note))
    return env, mapped, ignored


def _shared_volumes(body: dict[str, Any], services: dict[str, Any], name: str) -> str:
    """The volumes of the compose service `name` (`body`), each with the services sharing it."""

    def sources(service: object) -> set[str]:
        mounts = service.get("volumes") if isinstance(service, dict) else None
        found = set()
        for mount in mounts if isinstance(mounts, list) else []:
            source = mount.get("source") if isinstance(mount, dict) else str(mount).split(":", 1)[0]
            if source:
                found.add(str(source))
        return found

    parts = []
    for source in sorted(sources(body)):
        sharing = sorted(
            str(other) for other, spec in services.items() if other != name and source in sources(spec)
        )
        parts.append(f"{source} (shared with {', '.join(sharing)})" if sharing else source)
    return "the sandbox mounts no compose volume; " + ", ".join(parts) + " not mounted"


def _shown(build: dict[str, str], path: Path) -> str:
    """`build`'s context as the compose file at `path` would name it (relative to its folder)."""
    return os.path.relpath(build["context"], path.parent) + "/"


def _compose_build(build: object, path: Path, name: str) -> tuple[dict[str, str], list[str]]:
    """A compose ``build`` (a context string, or a mapping) as an `ImageBuild` mapping with an
    absolute context, and the mapping's keys reroll does not apply.

    Raises:
        TaskError: not a string or mapping, a variable other than Harbor's ``CONTEXT_DIR``, the
            context folder missing, or a Dockerfile path leaving it (the file and service named).
    """
    where = f"{path}: service {name!r}: build"
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        raise TaskError(f"{where}: a context path or a mapping is expected, not {build!r}")
    context = str(build.get("context") or ".")
    for variable in CONTEXT_VARIABLES:
        context = context.replace(variable, str(path.parent))
    dockerfile = str(build.get("dockerfile") or "Dockerfile")
    if "$" in context:
        raise TaskError(f"{where}.context {context!r}: only Harbor's ${{CONTEXT_DIR}} is substituted")
    folder = (path.parent / context).resolve()
    if not folder.is_dir():
        raise TaskError(f"{where}.context {context!r}: no such folder ({folder})")
    if dockerfile.startswith("/") or ".." in dockerfile.split("/"):
        raise TaskError(f"{where}.dockerfile {dockerfile!r}: must be a relative path inside the context")
    unapplied = sorted(str(key) for key in build if key not in BUILD_HONOURED)
    return {"context": str(folder), "dockerfile": dockerfile}, unapplied


def _shell_line(entrypoint: object, command: object) -> str:
    """A compose ``entrypoint`` and ``command`` (strings or lists) as one shell line."""
    parts: list[str] = []
    for value in (entrypoint, command):
        if isinstance(value, list):
            parts.append(shlex.join(str(item) for item in value))
        elif value is not None:
            parts.append(str(value))
    return " ".join(parts)


def _compose_env(environment: object, path: Path, name: str) -> dict[str, str]:
    """A compose ``environment`` (a mapping, or a list of ``KEY=VALUE``) as a mapping."""
    if isinstance(environment, dict):
        return {str(key): "" if value is None else str(value) for key, value in environment.items()}
    if isinstance(environment, list):
        return dict(str(item).partition("=")[::2] for item in environment)
    raise TaskError(f"{path}: service {name!r}: 'environment' must be a mapping or a list")


def _compose_health(check: dict[str, Any], path: Path, name: str) -> dict[str, Any] | None:
    """A compose ``healthcheck`` as a `HealthCheck` mapping; None for ``test: ["NONE"]``."""
    test = check.get("test")
    if isinstance(test, str):
        command = test
    elif isinstance(test, list) and test and test[0] == "NONE":
        return None
    elif isinstance(test, list) and len(test) > 1 and test[0] in ("CMD", "CMD-SHELL"):
        command = shlex.join(test[1:]) if test[0] == "CMD" else " ".join(test[1:])
    else:
        raise TaskError(f"{path}: service {name!r}: healthcheck.test {test!r} is not a command")
    health: dict[str, Any] = {"command": command}
    for key in ("interval", "timeout", "start_period"):
        if key in check:
            target = f"{key}_sec"
            health[target] = compose_seconds(check[key], f"{path}: service {name!r}: healthcheck.{key}")
    if "retries" in check:
        health["retries"] = check["retries"]
    return health


def compose_seconds(value: object, field: str) -> float:
    """A compose duration (``"1m30s"``, ``"500ms"``, a number of seconds) in seconds.

    Raises:
        TaskError: not a duration (the message names `field`).
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise TaskError(f"{field}: {value!r} is not a duration like '10s' or '1m30s'")
    return sum(float(number) * SECONDS_PER_UNIT[unit] for number, unit in parts)
