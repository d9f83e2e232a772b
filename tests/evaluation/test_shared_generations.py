"""Generations shared, scores per concept: an arm whose generations do not depend on the concept (the baseline,
PASTA on the instruction, a fixed system prompt) is generated once for any number of concept suites in a save_dir
and scored by each concept's own task; an arm that reads the concept, or an unseeded sample, is generated afresh."""

from __future__ import annotations

import pytest

from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.state import PASTA
from steer_hydra.core import ModelSource
from steer_hydra.evaluation.provider import SteeringPipelineModelAPI
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.evaluation.suite import InspectSuite
from steer_hydra.models import TINY_REF
from steer_hydra.store import SaveDir
from steer_hydra.store.generations import GenerationStore

TASK = "steer_hydra/concept_steering"
SOURCE = ModelSource(TINY_REF, device_map=None)


def concept_suite(concept: str, **overrides) -> InspectSuite:
    return InspectSuite(
        name=f"concept_steering_dev_{concept}",
        tasks=(TASK,),
        task_args={"concept": concept, "split": "dev"},
        limit=3,
        generate_overrides={"max_tokens": 8, "temperature": 0.0, **overrides},
    )


@pytest.fixture
def generated_rows(monkeypatch):
    """One entry per request the pipeline generated (the provider assembles each generated output once)."""
    rows: list[int] = []
    original = SteeringPipelineModelAPI._assemble_model_output

    def counting(self, output, **kwargs):
        rows.append(1)
        return original(self, output, **kwargs)

    monkeypatch.setattr(SteeringPipelineModelAPI, "_assemble_model_output", counting)
    return rows


def evaluate(save_dir, arms, concepts, **kwargs) -> SteeringEval:
    runner = SteeringEval(
        arms, SOURCE, [concept_suite(c) for c in concepts], save_dir=save_dir, progress=False, **kwargs
    )
    runner.run()
    return runner


def completions(runner: SteeringEval, arm: str, concept: str) -> list[str]:
    frame = runner.samples_frame(None, suite=f"concept_steering_dev_{concept}", task=TASK, include_text=True)
    return frame[frame["arm"] == arm].sort_values("sample_id")["completion"].tolist()


def test_the_baseline_and_pasta_generate_once_for_any_number_of_concepts(tmp_path, generated_rows):
    arms = {"baseline": [], "pasta": [PASTA(head_config=[0, 1], alpha=0.01)]}
    evaluate(tmp_path / "one", arms, ["weddings"])
    one = sum(generated_rows)
    generated_rows.clear()
    runner = evaluate(tmp_path / "three", arms, ["weddings", "joy", "french"])
    assert sum(generated_rows) == one > 0  # three concepts cost what one does
    for arm in arms:
        texts = [completions(runner, arm, c) for c in ("weddings", "joy", "french")]
        assert texts[0] == texts[1] == texts[2] and len(texts[0]) == 3
    # each concept's suite is scored by its own task: a log per concept, the concept in its samples' metadata
    results = runner.results()
    suites = results[results["metric"] == "mean"].groupby("suite")["task"].count()
    assert set(suites.index) == {f"concept_steering_dev_{c}" for c in ("weddings", "joy", "french")}
    frame = runner.samples_frame(None, suite="concept_steering_dev_joy", task=TASK, metadata_keys=["concept"])
    assert set(frame["concept"]) == {"joy"}


def test_a_later_run_into_the_save_dir_reads_them_and_an_arm_that_reads_the_concept_generates(tmp_path, generated_rows):
    evaluate(tmp_path, {"baseline": []}, ["weddings"])
    assert sum(generated_rows) > 0
    generated_rows.clear()
    evaluate(tmp_path, {"baseline": []}, ["pirate"])  # a new concept, another run: nothing to generate
    assert sum(generated_rows) == 0
    for concept in ("weddings", "pirate"):  # a concept-specific arm: its own configuration, its own generations
        evaluate(tmp_path, {"prompt": [SystemPrompt(text=f"Talk about {concept}.")]}, [concept])
        assert sum(generated_rows) > 0
        generated_rows.clear()


def test_shared_outputs_are_marked_in_the_logs_and_kept_under_the_save_dir(tmp_path):
    runner = evaluate(tmp_path, {"baseline": []}, ["weddings", "joy"])
    from inspect_ai.log import read_eval_log

    cells = runner.results().drop_duplicates("suite")
    marks = {}
    for cell in cells.itertuples():
        log = read_eval_log(str(tmp_path / cell.log))
        marks[cell.suite] = {sample.output.metadata.get("generation") for sample in log.samples}
    assert marks == {"concept_steering_dev_weddings": {"new"}, "concept_steering_dev_joy": {"shared"}}
    assert len(list((SaveDir(tmp_path).root / "generations").rglob("*.json"))) == 3


def test_an_unseeded_sample_is_never_shared_and_a_seeded_one_is():
    sampled = {"prompt": "x", "gen_kwargs": {"do_sample": True, "temperature": 0.7}, "runtime_kwargs": {}, "n": 1}
    assert GenerationStore.request_key(sampled) is None
    seeded = {**sampled, "gen_kwargs": {**sampled["gen_kwargs"], "seed": 3}}
    assert GenerationStore.request_key(seeded) is not None
    assert GenerationStore.request_key(seeded) != GenerationStore.request_key({**seeded, "prompt": "y"})
    greedy = {**sampled, "gen_kwargs": {"do_sample": False}}
    assert GenerationStore.request_key(greedy) is not None


def test_trials_keep_their_own_generations(tmp_path, generated_rows):
    evaluate(tmp_path, {"baseline": []}, ["weddings"], num_trials=2)
    two_trials = sum(generated_rows)
    generated_rows.clear()
    evaluate(tmp_path / "single", {"baseline": []}, ["weddings"])
    assert two_trials == 2 * sum(generated_rows)  # greedy trials are alike, yet each trial generates its own
