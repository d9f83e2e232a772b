"""Second models and files the arm's controls name (`BaseControl.references`) are resolved and checked before the
main model loads, each problem one line naming `arm.controls.<slot>.<arg>` and the fix: a reward model, an amateur,
an expert that does not resolve; a causal LM given as a reward model (its scoring head would be random); a LoRA
folder whose weights file is truncated or whose tensors do not fit the model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from steer_hydra.app.preflight import check_control_references, preflight, preflight_references
from steer_hydra.core.errors import ConfigError
from steer_hydra.models import build_tiny_model
from steer_hydra.models.checks import safetensors_header


def _arm(option: str, **args: str) -> list[str]:
    return [f"+control@arm.controls.slot={option}", *(f"arm.controls.slot.{k}='{v}'" for k, v in args.items())]


def _refused(compose_cfg, overrides: list[str]) -> str:
    cfg = compose_cfg(overrides)
    preflight(cfg)  # the cheap checks pass: only the references are wrong
    with pytest.raises(ConfigError) as refused:
        preflight_references(cfg)
    message = str(refused.value)
    assert "\n" not in message and "Fix:" in message
    return message


@pytest.mark.parametrize(
    ("option", "arg", "value", "expected"),
    [
        ("reward_guided_decoding", "reward_model", "/nonexistent/rm", "no such local folder"),
        ("value_guidance", "value_model", "/nonexistent/vm", "no such local folder"),
        ("contrastive_decoding", "amateur", "/nonexistent/amateur", "no such local folder"),
        ("dexperts", "anti_expert", "no-such-org/no-such-anti-expert", "not in the Hugging Face cache"),
        ("load_checkpoint", "checkpoint", "/nonexistent/checkpoint", "no such local folder"),
    ],
)
def test_a_second_model_that_does_not_resolve_is_named_before_the_model_loads(
    compose_cfg, monkeypatch, option, arg, value, expected
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # an unknown Hub id fails at once instead of asking the Hub
    good = {"dexperts": {"expert": "steer_hydra:tiny?seed=1&hidden_size=32"}}.get(option, {})
    message = _refused(compose_cfg, _arm(option, **good, **{arg: value}))
    assert message.startswith(f"arm.controls.slot.{arg}={value!r}") and expected in message


def test_several_second_models_are_numbered_and_a_merge_names_each_input(compose_cfg, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = [
        *_arm("proxy_tuning", expert="/nonexistent/expert", anti_expert="/nonexistent/anti"),
        "+control@arm.controls.merge=model_merge",
        "arm.controls.merge.models=[{model: /nonexistent/a, weight: 0.5},{model: steer_hydra:tiny, weight: 0.5}]",
    ]
    message = _refused(compose_cfg, overrides)
    assert message.startswith("3 problems: (1) arm.controls.slot.expert='/nonexistent/expert'")
    assert "(2) arm.controls.slot.anti_expert=" in message and "(3) arm.controls.merge.models[0].model=" in message


def test_a_causal_lm_given_as_a_reward_model_is_refused_for_its_random_head(compose_cfg, tmp_path):
    folder = tmp_path / "causal_lm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    message = _refused(compose_cfg, _arm("reward_guided_decoding", reward_model=str(folder)))
    assert "is not a sequence classifier" in message and "randomly initialized scoring head" in message
    message = _refused(compose_cfg, _arm("fudge", value_model="steer_hydra:tiny"))
    assert message.startswith("arm.controls.slot.value_model='steer_hydra:tiny' is not a sequence classifier")
    ok = compose_cfg(_arm("reward_guided_decoding", reward_model="steer_hydra:tiny-reward"))
    preflight_references(ok)  # a reward model: passes


def _lora(folder: Path, shapes: dict[str, list[int]]) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"], "base_model_name_or_path": "other"})
    )
    tensors = {name: torch.zeros(shape) for name, shape in shapes.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_a_damaged_or_misfitting_lora_folder_is_refused_before_the_model_loads(compose_cfg, tmp_path):
    key = "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_{part}.weight"
    fits = {key.format(layer=0, part="A"): [4, 64], key.format(layer=0, part="B"): [64, 4]}  # the tiny model: 64
    good = _lora(tmp_path / "good", fits)
    preflight_references(compose_cfg(_arm("lora_adapter", adapter=str(good))))

    truncated = _lora(tmp_path / "truncated", fits)
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a copy cut short
    with pytest.raises(ValueError, match="it is truncated"):
        safetensors_header(weights)
    message = _refused(compose_cfg, _arm("lora_adapter", adapter=str(truncated)))
    assert f"arm.controls.slot.adapter='{truncated}': adapter_model.safetensors is damaged" in message

    wide = _lora(tmp_path / "wide", {key.format(layer=0, part="A"): [4, 128], key.format(layer=0, part="B"): [64, 4]})
    message = _refused(compose_cfg, _arm("lora_adapter", adapter=str(wide)))
    assert "does not fit the model 'steer_hydra:tiny'" in message and "has shape [4, 128]" in message
    assert "takes [4, 64]" in message and "base model 'other'" in message
    deep = _lora(tmp_path / "deep", {key.format(layer=5, part="A"): [4, 64]})
    assert "adapts layer 5, and the model 'steer_hydra:tiny' has 2 decoder layers" in _refused(
        compose_cfg, _arm("lora_adapter", adapter=str(deep))
    )


def test_a_real_peft_adapter_of_the_model_passes(compose_cfg, tmp_path):
    from peft import LoraConfig, get_peft_model

    folder = tmp_path / "adapter"
    model, _ = build_tiny_model()
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"])).save_pretrained(
        str(folder)
    )
    assert (
        check_control_references(
            {
                "model": {"model_name_or_path": "steer_hydra:tiny"},
                "arm": {
                    "controls": {
                        "lora": {"_target_": "steer_hydra.controls.structural.LoRAAdapter", "adapter": str(folder)}
                    }
                },
            }
        )
        == []
    )


@pytest.mark.slow
def test_a_missing_reward_model_stops_the_job_in_one_line_before_the_model_loads(run_main, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    code, out, err = run_main(
        "logger=none",
        "progress=false",
        f"output_root={tmp_path / 'out'}",
        *_arm("reward_guided_decoding", reward_model="/nonexistent/rm"),
    )
    lines = [line for line in err.splitlines() if "invalid configuration" in line]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "arm.controls.slot.reward_model='/nonexistent/rm': no such local folder" in lines[0]
    assert "Loading" not in out + err and time.monotonic() - started < 120  # no model loaded, no Hub retries
