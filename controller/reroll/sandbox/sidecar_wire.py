"""The sidecar's RPC messages made of and into the controller's types: the requests an
`ExecOptions` and a `VerifyScript` become (`exec_request`, `verify_request`), the hardening
report and the result of a Verify stream (`verify_outcome`); a graded reward
(`reroll_contracts.graded`): verifier.md's aggregate policy into
``VerifyRequest.aggregate_policy``, ``VerifyResult.graded`` out of it. The sidecar's side is
`reroll_sidecar.rewards` (``policy_from_message``, ``graded_message``)."""

from __future__ import annotations

from typing import cast

from reroll_contracts.graded import Aggregate, AggregateMethod, AggregatePolicy, GradedReward
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb

from reroll.sandbox.results import ExecOptions, HardeningReport, OutputTail, VerifyOutcome, VerifyScript


def exec_request(argv: list[str], options: ExecOptions) -> pb.ExecRequest:
    """`argv` run with `options` as the sidecar's ``ExecRequest``: the defaults of
    `ExecOptions` filled in (the sidecar's folder and user, its environment inherited, no
    timeout, no stdin, not a service)."""
    return pb.ExecRequest(
        argv=argv,
        cwd=options.get("cwd", ""),
        env=dict(options.get("env") or {}),
        inherit_env=options.get("inherit_env", True),
        user=options.get("user", ""),
        timeout_seconds=options.get("timeout_seconds", 0.0),
        stdin=options.get("stdin", b""),
        service=options.get("service", False),
    )


def verify_request(run: VerifyScript) -> pb.VerifyRequest:
    """`run` as the sidecar's ``VerifyRequest``."""
    policy = run.aggregate_policy
    return pb.VerifyRequest(
        verifier_dir=run.verifier_dir,
        script=run.script,
        reward_dir=run.reward_dir,
        env=dict(run.env),
        timeout_seconds=run.timeout_seconds,
        soft=run.soft,
        keep_agent_processes=run.keep_agent_processes,
        own_network=run.own_network,
        cwd=run.cwd,
        image_env=dict(run.image_env),
        aggregate_policy=policy_message(policy) if policy is not None else None,
    )


def policy_message(policy: AggregatePolicy) -> pb.AggregatePolicy:
    """`policy` as ``VerifyRequest.aggregate_policy`` carries it (an undeclared field stays unset)."""
    message = pb.AggregatePolicy(method=policy.method or "", has_criteria=policy.criteria is not None)
    if policy.weights is not None:
        message.weights.values.update(policy.weights)
    if policy.threshold is not None:
        message.threshold = policy.threshold
    message.criteria.extend(policy.criteria or ())
    return message


def graded_reward(result: pb.VerifyResult) -> GradedReward:
    """The graded reward a Verify result carries (``graded``; its reward is ``rewards["reward"]``)."""
    aggregate = None
    if result.graded.HasField("aggregate"):
        wire = result.graded.aggregate
        aggregate = Aggregate(
            method=cast(AggregateMethod, wire.method),
            value=wire.value,
            weights=dict(wire.weights),
            threshold=wire.threshold if wire.HasField("threshold") else None,
        )
    return GradedReward(reward=result.rewards["reward"], items=dict(result.graded.items), aggregate=aggregate)


def hardening_report(message: pb.HardeningReport) -> HardeningReport:
    """The sidecar's hardening report as the controller keeps it (``verifier/hardening.json``)."""
    return HardeningReport(
        message.killed_groups, list(message.restored), list(message.deleted), list(message.notes)
    )


def verify_outcome(
    result: pb.VerifyResult, report: HardeningReport, output: dict[str, OutputTail]
) -> VerifyOutcome:
    """The outcome of a Verify stream: its `result`, hardening `report` and the script's `output`."""
    return VerifyOutcome(
        hardening=report,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        stdout=output["stdout"].value(),
        stderr=output["stderr"].value(),
        reward_file=result.reward_file,
        reward_content=result.reward_content,
        rewards=dict(result.rewards),
        reward_error=result.reward_error,
        pytest_report=result.pytest_report,
        leftover=result.leftover,
        cleanup=list(result.cleanup),
        graded=graded_reward(result) if result.HasField("graded") else None,
    )
