"""Timers around the stages of ``reroll branch`` and of its children, for the fork benchmarks
(`fork_breakdown`): `STAGES` names them; `instrument` wraps them where their modules are loaded
already (a benchmark that calls ``branch`` in its own process), `instrument_on_import` as their
modules load (a ``reroll branch`` command timed from its start: nothing imported early for it).
Each call appends a `Span` to `SPANS`, the child's name being the ``run_branch`` it runs under
(`CHILD`), ``branch`` outside them. Importing this module loads no reroll module.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

STAGES = [
    ("reroll.cli.branch", "_branched", "command (its flags, imports, the branch)"),
    ("reroll.host.shared_process", "prestart_proxy", "start the shared proxy (and scripted model)"),
    ("reroll.jobs.branch", "_open_points", "open the run folder and checkpoint"),
    ("reroll.jobs.branch", "_TreePlan.refuse_unrunnable", "check the first child"),
    ("reroll.jobs.branch", "_TreePlan.write_parent", "write the parent folder"),
    ("reroll.jobs.branch", "_TreePlan.reach_cut", "find the layers and pool"),
    ("reroll.rollout.layers", "load_checkpoint", "load_checkpoint (read, sha256)"),
    ("reroll.jobs.runner", "Runner.run", "runner"),
    ("reroll.jobs.branch", "run_branch", "child"),
    ("reroll.jobs.branch", "_open_point", "open the checkpoint"),
    ("reroll.rollout.start", "_configured", "settings and extensions"),
    ("reroll.rollout.start", "create_run_folder", "create the run folder"),
    ("reroll.rollout.lifecycle", "_new_sandbox", "sandbox object"),
    ("reroll.rollout.lifecycle", "_set_up", "set up (gate, proxy, sandbox, install, hooks)"),
    ("reroll.rollout.lifecycle", "start_llm_side", "model server and proxy registration"),
    ("reroll.host.shared_process", "shared_process", "shared process (started or found)"),
    ("reroll.host.shared_process", "SharedProcess.post", "registration"),
    ("reroll.sandbox.local.isolated", "IsolatedSandbox.start", "sandbox start"),
    ("reroll.sandbox.local.isolated", "ensure_bundle", "sidecar bundle"),
    ("reroll.sandbox.local.isolated", "IsolatedSandbox._lay_out", "lay out"),
    ("reroll.sandbox.local.storage", "SandboxDisk.child_of", "disk: child of the pool"),
    ("reroll.sandbox.local.identity", "shift_tree", "shift owners"),
    ("reroll.sandbox.local.rootview", "chown_tree", "chown"),
    ("reroll.host.child_process", "ChildProcess.start", "a child process to ready"),
    ("reroll.sandbox.base", "Sandbox.wait_ready", "sidecar ready"),
    ("reroll.sandbox.local.netns", "Forwarder.forward_host_ports", "forward the proxy port"),
    ("reroll.sandbox.local.netns", "attach_pasta", "pasta"),
    ("reroll.sandbox.docker.backend", "DockerSandbox.start", "sandbox start"),
    ("reroll.sandbox.ahead", "take_ahead", "the sandbox started ahead (waited for)"),
    ("reroll.sandbox.docker.backend", "DockerSandbox._create", "create (images, network, disk, container)"),
    ("reroll.sandbox.docker.images", "ensure_images", "base image check"),
    ("reroll.sandbox.docker.images", "task_image", "task image check"),
    ("reroll.sandbox.docker.conventions", "image_defaults", "image defaults (inspect)"),
    ("reroll.sandbox.docker.backend", "DockerSandbox._ensure_network", "network"),
    ("reroll.sandbox.docker.backend", "DockerSandbox._sized_volumes", "disk and volumes"),
    ("reroll.sandbox.docker.snapshots", "CowSnapshots.make_disk", "disk: child of the pool"),
    ("docker.models.volumes", "VolumeCollection.create", "volume create"),
    ("docker.models.containers", "ContainerCollection.create", "container create"),
    ("reroll.sandbox.docker.layer", "mount_layer", "layer onto the disk"),
    ("reroll.sandbox.docker.snapshots", "CowSnapshots.give_layer", "give the frozen layer"),
    ("docker.models.containers", "Container.start", "container start"),
    ("reroll.sandbox.docker.backend", "DockerSandbox._wait_ready", "sidecar to ready (polled)"),
    ("reroll.sandbox.docker.backend", "DockerSandbox.stop", "sandbox stop"),
    ("reroll.rollout.lifecycle", "install_agent", "agent install (check)"),
    ("reroll.rollout.hooks", "Hooks.after_sandbox_start", "after_sandbox_start hooks"),
    ("reroll.rollout.verify.script_verifier", "TestScriptVerifier.prepare", "verifier baseline"),
    ("reroll.rollout.hooks", "Hooks.before_agent", "before_agent hooks"),
    ("reroll.rollout.layers", "restore_checkpoint", "restore the layers"),
    ("reroll.rollout.agent_phase", "run_agent", "agent (to its exit)"),
    ("reroll.rollout.lifecycle", "_settle", "settle (proxy stop, quiesce, manifest)"),
    ("reroll.rollout.verify.script_verifier", "TestScriptVerifier.verify", "verify"),
    ("reroll.sandbox.local.isolated", "IsolatedSandbox.stop", "sandbox stop"),
    ("reroll.rollout.lifecycle", "_write_result", "write result.json"),
]
"""(module, [Class.]function, label): the stages timed, outermost first."""

CHILD: contextvars.ContextVar[str] = contextvars.ContextVar("child", default="branch")


@dataclass
class Span:
    child: str
    label: str
    start: float
    """``time.time()``."""
    end: float


SPANS: list[Span] = []


def _timed(function: Callable[..., Any], label: str) -> Callable[..., Any]:
    """`function` recording a `Span` per call (a child's: `CHILD` is set on ``run_branch``)."""

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            token = CHILD.set(kwargs["name"]) if label == "child" else None  # run_branch's folder
            began = time.time()
            try:
                return await function(*args, **kwargs)
            finally:
                SPANS.append(Span(CHILD.get(), label, began, time.time()))
                if token is not None:
                    CHILD.reset(token)

        return timed_async

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.time()
        try:
            return function(*args, **kwargs)
        finally:
            SPANS.append(Span(CHILD.get(), label, began, time.time()))

    return timed


def _wrap(module: ModuleType, name: str, label: str) -> None:
    """Wrap `module`'s stage `name` (``Class.method`` on its class; a function wherever a loaded
    module bound it, ``from m import f`` included)."""
    if "." in name:
        owner_name, attribute = name.split(".")
        owner = getattr(module, owner_name)
        setattr(owner, attribute, _timed(getattr(owner, attribute), label))
        return
    original = getattr(module, name)
    wrapped = _timed(original, label)
    for loaded in list(sys.modules.values()):
        if getattr(loaded, name, None) is original:
            setattr(loaded, name, wrapped)


def instrument() -> None:
    """Wrap every stage of `STAGES`, importing its module."""
    for module_name, name, label in STAGES:
        _wrap(importlib.import_module(module_name), name, label)


IMPORTS = ("reroll.cli.app", "reroll.jobs.branch")
"""Modules whose import `instrument_on_import` times too (a span ``import NAME``)."""


class _Hook(importlib.abc.MetaPathFinder):
    """Wraps the stages of a module of `STAGES` once it has run (`instrument_on_import`)."""

    def __init__(self, imports: Sequence[str]) -> None:
        self.imports = imports
        self.busy = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        stages = [(function, label) for module, function, label in STAGES if module == name]
        if self.busy or not (stages or name in self.imports):
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            began = time.time()
            run(module)
            if name in self.imports:
                SPANS.append(Span(CHILD.get(), f"import {name}", began, time.time()))
            for function, label in stages:
                _wrap(module, function, label)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def instrument_on_import(imports: Sequence[str] = IMPORTS) -> None:
    """Wrap every stage of `STAGES` when its module is imported, and time the import of each of
    `imports`; call it before any reroll module is loaded."""
    sys.meta_path.insert(0, _Hook(imports))
