"""Residency: consecutive runs in one process that use the same model reuse the loaded base instead of loading it
again, and every sample is byte for byte what a fresh load per run gives, for every control that modifies the model
(PASTA, CAA, ActAdd, directional ablation, LoRA merged and unmerged)."""

from __future__ import annotations

import pytest

from steer_hydra.controls.state import CAA, PASTA, ActAdd, DirectionalAblation
from steer_hydra.controls.structural import LoRAAdapter
from steer_hydra.core import ModelSource, resident
from steer_hydra.core.sweeps import PipelineFactory
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.models import TINY_REF, TinySpec, build_tiny_model
from steer_hydra.tasks import smoke_suite
from steer_hydra.tasks.suites import SMOKE_TASKS

PAIRS = [
    {"prompt": "How do you feel today?", "positive": "I feel wonderful and happy.", "negative": "I feel awful."},
    {"prompt": "Describe the weather.", "positive": "It is a bright, lovely day.", "negative": "It is gloomy."},
]
SOURCE = ModelSource(TINY_REF, device_map=None)


def lora_folder(folder) -> str:
    """A random rank-4 LoRA on the tiny model's q_proj and v_proj (nothing trained)."""
    import torch
    from peft import LoraConfig, get_peft_model

    model, _ = build_tiny_model(TinySpec())
    with torch.random.fork_rng():
        torch.manual_seed(3)
        peft_model = get_peft_model(
            model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        )
    peft_model.save_pretrained(str(folder))
    return str(folder)


def arms(adapter: str) -> dict[str, list]:
    """The model-modifying controls, each its own job, with the baseline between and after them."""
    return {
        "baseline": [],
        "pasta": [PASTA(head_config=[0, 1], alpha=0.01)],
        "caa": [CAA(data=PAIRS, layer_id=1, multiplier=4.0)],
        "actadd": [ActAdd(positive_prompt="Love", negative_prompt="Hate", layer_id=1, multiplier=4.0)],
        "ablation": [DirectionalAblation(data=PAIRS, layer_id=1)],
        "lora_merged": [LoRAAdapter(adapter=adapter, merge=True)],
        "lora_live": [LoRAAdapter(adapter=adapter, merge=False)],
        "baseline_again": [],
    }


def run_jobs(save_dir, adapter: str, *, residency: bool) -> dict[str, tuple[list, str]]:
    """Each arm as its own run (one job each, in this process): its completions in sample order and residency."""
    out = {}
    for name, controls in arms(adapter).items():
        runner = SteeringEval(
            {name: controls},
            SOURCE,
            [smoke_suite(limit=3, max_tokens=12)],
            save_dir=save_dir / name,  # every job generates: nothing is reused from another job's cells
            progress=False,
            residency=residency,
        )
        records = runner.run()[name]
        samples = []
        for task in SMOKE_TASKS:
            frame = runner.samples_frame(None, task=task, include_text=True).sort_values("sample_id")
            samples += list(zip(frame["task"], frame["sample_id"], frame["completion"], strict=True))
        out[name] = (samples, records)
    return out


@pytest.mark.slow
def test_a_sweep_on_the_resident_base_gives_the_samples_of_a_fresh_load_per_job(tmp_path):
    adapter = lora_folder(tmp_path / "adapter")
    resident_run = run_jobs(tmp_path / "resident", adapter, residency=True)
    assert resident.holds()  # the base stays for the next job after the last one
    fresh_run = run_jobs(tmp_path / "fresh", adapter, residency=False)
    assert not resident.holds()
    for name, (samples, records) in resident_run.items():
        assert samples == fresh_run[name][0], name  # byte for byte
        residency = records[0]["provenance"]["model_residency"]
        assert residency == ("loaded" if name == "baseline" else "resident"), name
        assert fresh_run[name][1][0]["provenance"]["model_residency"] == "loaded"
    changed = [name for name, (samples, _) in resident_run.items() if samples != resident_run["baseline"][0]]
    assert sorted(changed) == ["ablation", "actadd", "caa", "lora_live", "lora_merged", "pasta"]  # each one steers


def test_a_factory_takes_the_base_an_earlier_factory_left_and_a_new_model_frees_it_first():
    resident.configure(True)
    first = PipelineFactory(SOURCE)
    with first.steered([]) as pipeline:
        model = pipeline.model
    first.release()
    assert first.residency == "loaded" and resident.holds()
    second = PipelineFactory(SOURCE)
    with second.steered([]) as pipeline:
        assert pipeline.model is model  # no load
    second.release()
    assert second.residency == "resident"
    other = PipelineFactory(ModelSource("steer_hydra:tiny-base", device_map=None))
    with other.steered([]) as pipeline:
        assert pipeline.model is not model and not resident.holds()  # the old base was freed before the load
    other.release()
    assert other.residency == "loaded" and resident.holds() and resident.resident_label().endswith("tiny-base")


def test_residency_off_frees_what_is_resident_and_loads_afresh():
    resident.configure(True)
    factory = PipelineFactory(SOURCE)
    with factory.steered([]):
        pass
    factory.release()
    assert resident.holds()
    resident.configure(False)
    assert not resident.holds()
    again = PipelineFactory(SOURCE)
    with again.steered([]):
        pass
    again.release()
    assert again.residency == "loaded" and not resident.holds()


def test_a_base_a_configuration_left_changed_is_never_kept():
    from steer_hydra.core.controls import InputControl

    class Vandal(InputControl):  # edits a weight and does not restore it
        supports_batching = True

        def steer(self, model, tokenizer=None, **kwargs):
            import torch

            with torch.no_grad():
                next(model.parameters()).add_(1.0)

    resident.configure(True)
    factory = PipelineFactory(SOURCE)
    with factory.steered([Vandal()]):
        pass
    factory.release()
    assert not resident.holds()  # the tripwire dropped it; the next job loads a clean base


def test_the_residency_key_changes_with_the_checkpoint_files(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"12")
    identity = {"model_name_or_path": str(folder)}
    key = resident.residency_key(identity, "huggingface", {})
    assert key == resident.residency_key(identity, "huggingface", {})
    assert key != resident.residency_key(identity, "vllm", {})
    assert key != resident.residency_key(identity, "huggingface", {"dtype": "float16"})
    (folder / "model.safetensors").write_bytes(b"123")
    assert key != resident.residency_key(identity, "huggingface", {})
