"""The `--env` check in a guarded step (matrix.run.guarded): the user's environment is made and its spaces
compared with the model in a process of its own, under --timeout and the memory cap, so a constructor
that hangs or grows ends that step, never the runner, and every way it fails is one line."""

from __future__ import annotations

import tempfile
from pathlib import Path

from . import guarded, rollouts
from ..errors import InputError


def check(plan: rollouts.RolloutPlan, limits: guarded.Limits) -> None:
    if plan.open_loop:  # a recorded file: read bounded by the runner itself (matrix.userfiles)
        rollouts.check(plan, limits.memory_limit)
        return
    with tempfile.TemporaryDirectory(prefix="policy-matrix-env-check-") as folder:
        try:
            answer = guarded.run("env-check", {"plan": plan.as_dict()}, Path(folder), limits)
        except guarded.StepFailed as error:
            raise InputError(f"--env {plan.env[:100]!r}: checking the environment did not finish: {error}") from None
    if answer.get("error"):
        raise InputError(answer["error"])
    plan.action_low, plan.action_high = answer.get("action_low"), answer.get("action_high")  # what the check read


def guarded_step(spec: dict, folder: Path) -> dict:
    plan = rollouts.RolloutPlan.from_dict(spec["plan"])
    try:
        rollouts.check(plan)
    except InputError as error:
        return {"error": str(error)}
    return {"action_low": plan.action_low, "action_high": plan.action_high}  # the Box bounds the check found
