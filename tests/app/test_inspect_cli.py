"""The Inspect CLI builds steer_hydra pipelines from the app's config groups (`-M arm=... -M base_model=...`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_ai.log import read_eval_log
from inspect_ai.model import get_model

from steer_hydra.controls.state import PASTA
from steer_hydra.evaluation.provider import SteeringPipelineModelAPI


def test_get_model_with_model_args_builds_and_owns_a_steered_pipeline():
    import steer_hydra.app.inspect_entry  # noqa: F401  (the entry point Inspect loads)

    model = get_model(
        "steer_hydra/pasta", arm="pasta", base_model="tiny", **{"arm.controls.pasta.alpha": 0.2}, memoize=False
    )
    api = model.api
    assert isinstance(api, SteeringPipelineModelAPI)
    pipeline = api._pipeline
    assert pipeline.is_steered and [type(c) for c in pipeline.controls] == [PASTA]
    assert pipeline.controls[0].alpha == 0.2
    api.close()
    assert not pipeline.is_steered and pipeline.model is None  # built from model args: released on close


def test_the_model_name_is_the_arm_and_a_name_for_another_arm_is_refused_before_loading():
    from steer_hydra.app.inspect_entry import arm_overrides

    assert arm_overrides({"base_model": "tiny"}, "pasta") == ["arm=pasta", "model=tiny"]
    assert arm_overrides({"arm": "pasta"}, "pasta@ede177") == ["arm=pasta"]  # a display name from the logs
    with pytest.raises(ValueError, match=r"Fix: --model steer_hydra/baseline -M arm=baseline"):
        get_model("steer_hydra/pasta", arm="baseline", base_model="tiny", memoize=False)
    with pytest.raises(ValueError, match=r"Could not find 'arm/no_such_arm'.*Fix: name an arm option"):
        get_model("steer_hydra/no_such_arm", base_model="tiny", memoize=False)


def test_without_pipeline_or_model_args_the_error_names_both_ways():
    with pytest.raises(ValueError, match=r"as_inspect_model.*-M arm=pasta -M base_model=tiny"):
        SteeringPipelineModelAPI("x")


@pytest.mark.slow
def test_inspect_eval_cli_runs_a_pasta_arm_on_a_builtin_task(tmp_path):
    inspect = Path(sys.executable).parent / "inspect"
    cmd = [
        str(inspect),
        "eval",
        "steer_hydra/instruction_following",
        "--model",
        "steer_hydra/pasta",
        "-M",
        "arm=pasta",
        "-M",
        "base_model=tiny",
        "--limit",
        "2",
        "--max-tokens",
        "4",
        "--max-connections",
        "8",
        "--log-dir",
        str(tmp_path / "logs"),
        "--display",
        "none",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "INSPECT_DISPLAY": "none"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = (tmp_path / "logs").glob("*.eval")
    log = read_eval_log(str(path))
    assert log.status == "success" and log.eval.model == "steer_hydra/pasta"
    assert log.eval.model_args == {"arm": "pasta", "base_model": "tiny"} and len(log.samples) == 2
