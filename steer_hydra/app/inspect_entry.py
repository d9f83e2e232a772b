"""The `inspect_ai` entry point: registers the provider and the built-in tasks, and builds pipelines for the CLI.

`inspect eval steer_hydra/short_answer --model steer_hydra/pasta -M arm=pasta -M base_model=tiny` composes this
app's config groups with the `-M` pairs as overrides (`base_model` stands for the `model` group: Inspect's
`get_model()` has a `model` parameter of its own, so `-M model=...` never reaches a provider), builds and
steers the pipeline, and uses the options of the composed `provider` group. Pass `--max-connections` equal to
the batch ceiling (`provider.max_batch_size`, or 1 for an arm that cannot batch) so batches fill.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import steer_hydra.evaluation.provider as provider
import steer_hydra.tasks  # noqa: F401  (registers steer_hydra/<task>)
from steer_hydra.core.pipeline import SteeringPipeline
from steer_hydra.evaluation.provider import ProviderOptions

ALIASES = {"base_model": "model"}


def build_from_model_args(model_args: Mapping[str, Any]) -> tuple[SteeringPipeline, ProviderOptions]:
    """Compose the app config with `key=value` overrides from `model_args`; return the steered pipeline."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from steer_hydra.app.plan import JobPlan
    from steer_hydra.app.schema import register_configs

    register_configs()
    overrides = [f"{ALIASES.get(key, key)}={value}" for key, value in model_args.items()]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()
    plan = JobPlan.from_config(cfg)
    pipeline = SteeringPipeline(
        plan.model["model_name_or_path"],
        controls=plan.controls,
        backend=plan.backend,
        hf_model_kwargs=plan.model.get("hf_model_kwargs") or {},
        device_map=plan.model.get("device_map"),
        trust_remote_code=bool(plan.model.get("trust_remote_code")),
    )
    return pipeline.steer(), plan.options


provider.set_pipeline_builder(build_from_model_args)
