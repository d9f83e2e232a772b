"""The `inspect_ai` entry point: registers the provider, the built-in tasks and the judge scorer, and builds pipelines
for the CLI.

`inspect eval steer_hydra/short_answer --model steer_hydra/pasta -M arm=pasta -M base_model=tiny` composes this
app's config groups with the `-M` pairs as overrides (`base_model` stands for the `model` group: Inspect's
`get_model()` has a `model` parameter of its own, so `-M model=...` never reaches a provider), builds and
steers the pipeline, and uses the options of the composed `provider` group. Pass `--max-connections` with the
provider's `max_connections()` (the rule is stated in `steer_hydra.evaluation.provider`): Inspect's adaptive
concurrency ignores the provider's value unless it is given, and batches then do not fill.

The name after `steer_hydra/` is the arm: `--model steer_hydra/pasta -M base_model=tiny` runs arm `pasta`; with
`-M arm=...` the name must be that arm (or its display name `arm@...`), else the run is refused before any model
loads (a baseline silently labelled "pasta" would mislead every reader of the logs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import steer_hydra.evaluation.provider as provider
import steer_hydra.tasks  # noqa: F401  (registers steer_hydra/<task>)
import steer_hydra.tasks.judge  # noqa: F401  (registers the scorer steer_hydra/concept_judge)
from steer_hydra.core.pipeline import SteeringPipeline
from steer_hydra.evaluation.options import ProviderOptions

ALIASES = {"base_model": "model"}


def arm_overrides(model_args: Mapping[str, Any], model_name: str | None) -> list[str]:
    """The `-M` pairs as overrides, with the arm taken from the model name when `-M arm` is not given.

    Raises ValueError (naming the fix) when `-M arm=A` and the model name names another arm.
    """
    overrides = [f"{ALIASES.get(key, key)}={value}" for key, value in model_args.items()]
    named = (model_name or "").split("@", 1)[0]
    if not named:
        return overrides
    given = model_args.get("arm")
    if given is None:
        return [f"arm={named}", *overrides]
    if str(given) != named:
        raise ValueError(
            f"--model steer_hydra/{model_name} names arm {named!r}, but -M arm={given} was given; the logs would "
            f"label arm {given!r} as {named!r}. Fix: --model steer_hydra/{given} -M arm={given} (or drop -M arm "
            "to take the arm from the model name)."
        )
    return overrides


def build_from_model_args(
    model_args: Mapping[str, Any], model_name: str | None = None
) -> tuple[SteeringPipeline, ProviderOptions]:
    """Compose the app config with `key=value` overrides from `model_args` (the arm from `model_name` unless
    `-M arm` is given, see `arm_overrides`); return the steered pipeline."""
    from hydra.errors import HydraException

    from steer_hydra.app.compose import compose_config
    from steer_hydra.app.plan import JobPlan

    overrides = arm_overrides(model_args, model_name)
    try:
        cfg = compose_config(overrides, standalone=True)
    except HydraException as error:
        reason = str(error).split("\nConfig search path")[0].replace("\n\t", " ").replace("\n", " ")
        raise ValueError(
            f"--model steer_hydra/{model_name} with {overrides}: {reason}. Fix: name an arm option of the `arm` "
            "group (--model steer_hydra/pasta) or pass -M arm=<option>; see python -m steer_hydra --help."
        ) from error
    plan = JobPlan.from_config(cfg)
    pipeline = SteeringPipeline(plan.source, controls=plan.controls, backend=plan.backend)
    return pipeline.steer(), plan.options


provider.set_pipeline_builder(build_from_model_args)
