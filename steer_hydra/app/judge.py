"""The model judge of a job or a rescore (`judge=`): what it may name, and the Inspect model it becomes.

`judge` takes either
- an Inspect model string (`openai/gpt-4o-mini`, `hf/<repo>`, `vllm/<model>` with Inspect's usual base-url settings
  such as `VLLM_BASE_URL` or `OPENAI_BASE_URL`, `mockllm/model`), bound as given to Inspect's model role "judge";
- `steer_hydra/<model option>` (e.g. `steer_hydra/smollm2`): an unsteered pipeline of that option of the `model`
  group on the Hugging Face backend, wrapped with `as_inspect_model` and named `steer_hydra/judge-<option>@<digest>`
  (the digest is of the option's model config), so the name, and with it Inspect's cache key, identifies the
  weights the judge runs. It is built on first use (a job whose cells are all reused loads no judge) and released
  when the job or the rescore ends.

The judge scores the tasks in `tasks.judge.JUDGED_TASKS` (the concept-steering task) with `concept_judge`, beside
their rule scorers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from steer_hydra.core.identity import canonical_json
from steer_hydra.tasks.judge import JUDGE_ROLE, JUDGED_TASKS

PREFIX = "steer_hydra/"
CONF_MODEL_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"
FORMS = (
    "an Inspect model string (provider/model: openai/gpt-4o-mini, hf/<repo>, vllm/<model>, mockllm/model) or "
    "steer_hydra/<model option> (e.g. steer_hydra/smollm2)"
)


def model_options() -> list[str]:
    """The `model` group's built-in options."""
    return sorted(path.stem for path in CONF_MODEL_DIR.glob("*.yaml"))


def model_group_config(option: str) -> dict[str, Any]:
    """The `model` group option `option` as a plain dict (composed under the running app's search path when there is
    one, so user groups count); ValueError naming the options when it does not compose."""
    from omegaconf import OmegaConf

    from steer_hydra.app.compose import compose_config

    try:
        cfg = compose_config([f"model={option}"])
    except Exception as error:  # noqa: BLE001 - Hydra's errors for a missing option vary; say it in one line
        raise ValueError(
            f"judge={PREFIX}{option}: {option!r} is not an option of the model group ({type(error).__name__}). "
            f"Fix: judge={PREFIX}<one of {', '.join(model_options())}>."
        ) from error
    return dict(OmegaConf.to_container(cfg.model, resolve=True, enum_to_str=True))  # type: ignore[arg-type]


def check_judge(judge: str | None, tasks: Sequence[str], suite: str = "") -> tuple[str, ...]:
    """The suite's tasks the judge scores (`()` without a judge); ValueError naming the fix for a judge that is not a
    model name, a `steer_hydra/` option that does not exist, or a suite with nothing to judge."""
    if judge is None:
        return ()
    if not isinstance(judge, str) or "/" not in judge.strip("/") or judge != judge.strip():
        raise ValueError(f"judge={judge!r} names no model. Fix: judge=<{FORMS}>.")
    if judge.startswith(PREFIX):
        model_group_config(judge.removeprefix(PREFIX))
    judged = tuple(task for task in tasks if task in JUDGED_TASKS)
    if not judged:
        raise ValueError(
            f"judge={judge} scores only {list(JUDGED_TASKS)}, and suite {suite!r} runs none of them ({list(tasks)}). "
            "Fix: choose a suite that runs it (e.g. suite=concept_steering), or drop judge=."
        )
    return judged


class JudgeModel:
    """A `steer_hydra/<model option>` judge, built when first called (see the module docstring)."""

    def __init__(self, option: str, model: Mapping[str, Any]) -> None:
        self.option = option
        self.model = dict(model)
        weights = {key: value for key, value in self.model.items() if key != "name"}
        digest = hashlib.sha256(canonical_json(weights).encode()).hexdigest()[:8]
        self.model_name = f"judge-{option}@{digest}"
        self._pipeline: Any = None
        self._inspect_model: Any = None

    @property
    def name(self) -> str:
        """The judge's Inspect model name (`steer_hydra/judge-<option>@<digest>`)."""
        return f"{PREFIX}{self.model_name}"

    def __call__(self) -> Any:
        """The judge as an Inspect `Model` (its pipeline loads on the first call)."""
        if self._inspect_model is None:
            from inspect_ai.model import GenerateConfig

            from steer_hydra.core.backend import BackendSpec
            from steer_hydra.core.pipeline import SteeringPipeline
            from steer_hydra.core.source import ModelSource
            from steer_hydra.evaluation.options import ProviderOptions
            from steer_hydra.evaluation.provider import as_inspect_model

            source = ModelSource.from_config(self.model)
            self._pipeline = SteeringPipeline(source, backend=BackendSpec("huggingface")).steer()
            model = as_inspect_model(self._pipeline, options=ProviderOptions(), model_name=self.model_name)
            # Inspect's adaptive concurrency ignores the provider's own limit unless it is given (provider docs)
            model.config = GenerateConfig(max_connections=model.api.max_connections())
            self._inspect_model = model
        return self._inspect_model

    def release(self) -> None:
        """Close the judge's provider and free its model."""
        model, pipeline = self._inspect_model, self._pipeline
        self._inspect_model = self._pipeline = None
        if model is not None:
            model.api.close()
        if pipeline is not None:
            pipeline.release()


def judge_role(judge: str) -> str | JudgeModel:
    """What the runner binds to the "judge" role: the Inspect model string as given, or a `JudgeModel`."""
    if judge.startswith(PREFIX):
        option = judge.removeprefix(PREFIX)
        return JudgeModel(option, model_group_config(option))
    return judge


def judge_as_model(judge: Any) -> tuple[Any, Callable[[], None]]:
    """`(Inspect Model, release)` for a judge given as a `judge=` string or as an Inspect `Model` (kept as it is)."""
    if not isinstance(judge, str):
        return judge, lambda: None
    check_judge(judge, JUDGED_TASKS)
    role = judge_role(judge)
    if isinstance(role, JudgeModel):
        return role(), role.release
    from inspect_ai.model import get_model

    return get_model(role), lambda: None


__all__ = ["JUDGE_ROLE", "JudgeModel", "check_judge", "judge_as_model", "judge_role", "model_group_config"]
