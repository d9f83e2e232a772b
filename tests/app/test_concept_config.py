"""The job's `concept` key: the concept suites and controls read it, the concept arms are named by their method and
steer at the model's `steering_layer`, and a bad concept file is refused by pre-flight before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from steer_hydra.app import job as job_module
from steer_hydra.app.plan import JobPlan
from steer_hydra.app.preflight import model_shape, preflight
from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.state import CAA, ActAdd
from steer_hydra.tasks.concepts import concept_actadd_prompts, concept_pairs, concept_system_prompt

CONF = Path(__file__).resolve().parents[2] / "steer_hydra" / "conf"
CONCEPT_ARMS = ("caa_concept", "caa_concept_random", "caa_concept_negated", "actadd_concept", "prompt_concept")
STEERING_LAYERS = {
    "smollm2": 12,
    "smollm2-135m": 12,
    "tiny": 1,
    "tiny_base": 1,
    "qwen2.5-0.5b-instruct": 12,
    "llama-3.1-8b-instruct": 16,
    "gemma-2-2b-it": 20,
}


def test_caa_concept_on_smollm2_takes_the_models_layer_and_the_chosen_concepts_pairs(compose_cfg):
    plan = JobPlan.from_config(compose_cfg(["arm=caa_concept", "model=smollm2", "concept=joy"]))
    (control,) = plan.controls
    assert isinstance(control, CAA) and control.layer_id == 12
    assert list(control.data) == concept_pairs("joy")
    assert plan.arm == "caa_concept"  # the arm is named by its method, whatever the concept


@pytest.mark.parametrize("arm", CONCEPT_ARMS)
def test_every_concept_arm_reads_the_concept_and_passes_preflight(compose_cfg, arm):
    cfg = compose_cfg([f"arm={arm}", "concept=french"])
    preflight(cfg)
    plan = JobPlan.from_config(cfg)
    (control,) = plan.controls
    assert plan.arm == arm and "french" not in plan.arm
    if isinstance(control, CAA):
        assert control.layer_id == 1 and list(control.data) == concept_pairs("french")
    elif isinstance(control, ActAdd):
        assert control.layer_id == 1
        assert (control.positive_prompt, control.negative_prompt) == concept_actadd_prompts("french")
    else:
        assert isinstance(control, SystemPrompt) and control.text == concept_system_prompt("french")


def test_every_model_names_its_steering_layer_inside_the_model(compose_cfg):
    options = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
    assert options == sorted(STEERING_LAYERS)
    for option, layer in STEERING_LAYERS.items():
        cfg = compose_cfg([f"model={option}"])
        assert cfg.model.steering_layer == layer, option
        shape = model_shape({"model": {"model_name_or_path": cfg.model.model_name_or_path}})
        if shape is not None:  # the built-in models' shapes are known without loading them
            assert 0 <= layer < shape[0], (option, shape)
    gemma = compose_cfg(["model=gemma-2-2b-it"]).model
    assert gemma.model_name_or_path == "google/gemma-2-2b-it"
    assert gemma.hf_model_kwargs == {"dtype": "bfloat16", "attn_implementation": "eager"}


def test_the_steering_layer_is_not_part_of_the_save_dir_protocol(compose_cfg):
    plan = JobPlan.from_config(compose_cfg(["model=smollm2"], default_model=True))
    assert plan.model["steering_layer"] == 12 and "steering_layer" not in plan.protocol()["model"]


@pytest.mark.parametrize("suite", ["concept_steering", "concept_steering_dev", "concept_steering_test"])
def test_the_concept_suites_pass_the_concept_to_the_task(compose_cfg, suite, tmp_path):
    assert compose_cfg([f"suite={suite}"]).suite.task_args["concept"] == "weddings"
    assert compose_cfg([f"suite={suite}", "concept=sadness"]).suite.task_args["concept"] == "sadness"
    own = tmp_path / "mine.yaml"
    own.write_text((CONF.parent / "tasks" / "concept_data" / "joy.yaml").read_text().replace("name: joy", "name: mine"))
    cfg = compose_cfg([f"suite={suite}", f"concept={own}", "arm=caa_concept"])
    preflight(cfg)
    plan = JobPlan.from_config(cfg)
    assert plan.suite.task_args["concept"] == str(own) and list(plan.controls[0].data) == concept_pairs("joy")


BAD_CONCEPT = """\
name: mushrooms
description: "mushrooms: fungi, foraging, caps and spores"
kind: topic
pairs:
  - prompt: What did you do this morning?
    positive: I went foraging and found a basket of chanterelle mushrooms.
    negative: I went shopping and found a new pair of gloves on sale.
  - prompt: What is for dinner?
    positive: A risotto with porcini mushrooms and a little thyme.
"""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bad", ["pairs[1] has no 'negative' (line 8)", "Fix: give each pair prompt, positive and negative"]),
        ("cooking", ["concept='cooking'", "neither a built-in concept", "weddings", "Fix:"]),
    ],
)
def test_a_bad_concept_is_refused_by_preflight_before_any_model_loads(run_main, monkeypatch, tmp_path, value, expected):
    started = []
    monkeypatch.setattr(job_module, "run_job", lambda *a, **k: started.append(True))
    if value == "bad":
        value = str(tmp_path / "bad.yaml")
        Path(value).write_text(BAD_CONCEPT)
        expected = [f"concept='{value}': {value}: ", *expected]
    code, _, err = run_main("arm=caa_concept", f"concept={value}", f"output_root={tmp_path}", "logger=none")
    assert code == 1 and not started, "the job started: the bad concept was not caught up front"
    line = err.strip().splitlines()[-1]
    assert line.startswith("steer_hydra: invalid configuration: "), err
    for text in expected:
        assert text in line, (text, line)
    assert not list(tmp_path.rglob("*.eval")) and not list(tmp_path.rglob("protocol"))


@pytest.mark.parametrize("mistake", ["syntax", "content"])
def test_a_study_refuses_a_bad_concept_file_before_it_launches_any_job(run_main, monkeypatch, tmp_path, mistake):
    started = []
    monkeypatch.setattr(job_module, "run_job", lambda *a, **k: started.append(True))
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\npairs: [\n  - prompt: a\n" if mistake == "syntax" else BAD_CONCEPT)
    code, out, err = run_main(
        "--multirun", "experiment=concept_steering", f"concept={path}", f"output_root={tmp_path}", "logger=none"
    )
    assert code == 1 and not started
    assert "Launching" not in out + err and "re-run" not in (out + err).lower()
    line = err.strip().splitlines()[-1]
    assert line.startswith("steer_hydra: invalid study: ") and str(path) in line and "Fix" in line, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert not list(tmp_path.rglob("multiruns"))  # no sweep folder is left
