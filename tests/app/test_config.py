"""Every option of every config group composes and instantiates; bad overrides fail with named choices."""

from __future__ import annotations

from importlib.resources import files

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from steer_hydra.app.plan import JobPlan, build_controls
from steer_hydra.core import BaseControl, SteeringPipeline
from steer_hydra.core.errors import ConfigError
from steer_hydra.models import build_tiny_model

CONF = files("steer_hydra.conf")


def options(group: str) -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in CONF.joinpath(group).iterdir() if p.name.endswith(".yaml"))


def test_defaults_are_the_offline_smollm2_baseline_on_smoke(compose_cfg):
    cfg = compose_cfg(default_model=True)
    assert cfg.model.model_name_or_path == "steer_hydra:smollm2"
    assert compose_cfg().model.model_name_or_path == "steer_hydra:tiny"  # what the app tests run
    assert (cfg.arm.name, dict(cfg.arm.controls), cfg.suite.name, cfg.backend.kind.value) == (
        "baseline",
        {},
        "smoke",
        "huggingface",
    )
    assert cfg.logger.kind.value == "wandb" and cfg.logger.mode.value == "auto"


# control options with a required (`???`) argument, and the value the test gives it on the tiny model
REQUIRED_CONTROL_ARGS = {  # the options whose required argument (???) has no offline default
    "contrastive_decoding": ["arm.controls.slot.amateur='steer_hydra:tiny?seed=1&hidden_size=32'"],
    "reward_guided_decoding": ["arm.controls.slot.reward_model='steer_hydra:tiny-reward'"],
    **{
        option: ["arm.controls.slot.value_model='steer_hydra:tiny-reward'"]
        for option in ("value_guidance", "fudge", "args_guidance")
    },
    "contrastive_guidance": [
        "arm.controls.slot.models=['steer_hydra:tiny?seed=1&hidden_size=32']",
        "arm.controls.slot.weights=[-1.0]",
    ],
    **{
        option: [
            "arm.controls.slot.expert='steer_hydra:tiny?seed=1&hidden_size=32'",
            "arm.controls.slot.anti_expert='steer_hydra:tiny?seed=2&hidden_size=32'",
        ]
        for option in ("dexperts", "proxy_tuning")
    },
    # trained, merged and optimized controls: their data, inputs or checkpoint (nothing is trained or loaded here)
    "load_checkpoint": ["arm.controls.slot.checkpoint='steer_hydra:tiny?seed=1'"],
    "model_merge": ["arm.controls.slot.models=[{model:a,weight:1},{model:b,weight:1}]"],
    **{
        option: ["arm.controls.slot.data=[{prompt:a,response:b,chosen:b,rejected:c}]"]
        for option in ("sft_adapter", "dpo_adapter", "prewrite", "cpo", "gepa", "loreft")
    },
}


@pytest.fixture(scope="module")
def lora_folder(tmp_path_factory):
    """A random LoRA adapter of the tiny model (lora_adapter's required `adapter`; none ships offline)."""
    from peft import LoraConfig, get_peft_model

    folder = tmp_path_factory.mktemp("lora") / "adapter"
    model, _ = build_tiny_model()
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("option", options("control"))
def test_every_control_option_instantiates(compose_cfg, option, request):
    required = list(REQUIRED_CONTROL_ARGS.get(option, []))
    if option == "lora_adapter":
        required.append(f"arm.controls.slot.adapter='{request.getfixturevalue('lora_folder')}'")
    cfg = compose_cfg([f"+control@arm.controls.slot={option}", *required])
    (control,) = build_controls(cfg.arm.controls)
    assert isinstance(control, BaseControl)
    model, tokenizer = build_tiny_model()
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control])
    assert pipeline.check().ok, pipeline.check()


@pytest.mark.parametrize("option", options("arm"))
def test_every_arm_option_builds_a_plan(compose_cfg, option):
    # the default model: outside the app, the arm's default config_id is composed under it (arm_model included)
    plan = JobPlan.from_config(compose_cfg([f"arm={option}"], default_model=True))
    assert plan.arm == option
    assert (plan.config_id == "baseline") == (option == "baseline")
    assert all(isinstance(c, BaseControl) for c in plan.controls) and len(plan.controls) >= (option != "baseline")


@pytest.mark.parametrize(
    ("group", "check"),
    [
        ("model", lambda plan: plan.model["model_name_or_path"]),
        ("suite", lambda plan: plan.suite.tasks),
        ("provider", lambda plan: plan.options.max_batch_size >= 1),
        ("backend", lambda plan: plan.backend.kind),
        ("logger", lambda plan: True),
        ("experiment", lambda plan: plan.arm),
    ],
)
def test_every_option_of_the_other_groups_builds_a_plan(compose_cfg, group, check):
    for option in options(group):
        overrides = [f"{group}={option}"]
        if option == "vllm_serve":
            overrides.append("backend.options.base_url=http://127.0.0.1:1")
        plan = JobPlan.from_config(compose_cfg(overrides))
        assert check(plan), (group, option)


def test_arm_controls_compose_with_overrides_and_added_controls(compose_cfg):
    cfg = compose_cfg(["arm=pasta", "arm.controls.pasta.alpha=0.25", "+control@arm.controls.sys=system_prompt"])
    controls = build_controls(cfg.arm.controls)
    assert [type(c).__name__ for c in controls] == ["PASTA", "SystemPrompt"]
    assert controls[0].alpha == 0.25


def test_arm_model_specialization_is_picked_by_name(compose_cfg):
    cfg = compose_cfg(["arm=pasta", "model=llama-3.1-8b-instruct"])
    assert list(cfg.arm.controls.pasta.head_config) == [12, 13, 14, 15]
    assert list(compose_cfg(["arm=pasta"]).arm.controls.pasta.head_config) == [0, 1]


def test_unknown_option_lists_the_valid_names(compose_cfg):
    with pytest.raises(MissingConfigException) as info:
        compose_cfg(["arm=nope"])
    message = str(info.value)
    assert "Could not find 'arm/nope'" in message and "baseline" in message and "pasta" in message


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("suite.limit=abc", "suite.limit"),
        ("provider.seed_scope=whole", "provider.seed_scope"),
        ("num_trials=two", "num_trials"),
        ("logger.mode=sometimes", "logger.mode"),
    ],
)
def test_wrong_types_and_values_fail_at_compose(compose_cfg, override, named):
    with pytest.raises(ConfigCompositionException) as info:
        compose_cfg([override])
    cause = str(info.value.__cause__ or info.value)
    assert named.split(".")[-1] in cause or named in str(info.value)


def test_enum_errors_list_the_valid_values(compose_cfg):
    with pytest.raises(ConfigCompositionException) as info:
        compose_cfg(["provider.seed_scope=whole"])
    assert "expected one of [item, dispatch]" in str(info.value.__cause__)


def test_unknown_keys_are_refused(compose_cfg):
    with pytest.raises(ConfigCompositionException, match="model.revision"):
        compose_cfg(["model.revision=main"])


def test_bad_control_args_fail_before_any_model_loads(compose_cfg):
    with pytest.raises(ConfigError, match=r"arm.controls.pasta: PASTA.alpha must be a finite number > 0"):
        JobPlan.from_config(compose_cfg(["arm=pasta", "arm.controls.pasta.alpha=-1"]))
    with pytest.raises(ConfigError, match=r"arm.controls.pasta: .*unknown argument\(s\) \['alhpa'\]; valid arguments"):
        JobPlan.from_config(compose_cfg(["arm=pasta", "+arm.controls.pasta.alhpa=1"]))


def test_suite_and_provider_values_are_validated_by_the_library(compose_cfg):
    with pytest.raises(ConfigError, match="suite: .*limit"):
        JobPlan.from_config(compose_cfg(["suite.limit=0"]))
    with pytest.raises(ConfigError, match=r"suite: .*max_tasks must be an int >= 1; got 0\. Fix: suite.max_tasks="):
        JobPlan.from_config(compose_cfg(["suite.max_tasks=0"]))
    with pytest.raises(ConfigError, match="provider: .*max_batch_size"):
        JobPlan.from_config(compose_cfg(["provider.max_batch_size=0"]))
