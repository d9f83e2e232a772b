"""ConstrainedDecoding on the vLLM backends: each row's constraint travels as vLLM's structured outputs.

Offline (`backend=vllm`, a real engine on the tiny head-dim-64 model, marked `vllm`): outputs satisfy a regex, a
choice list and a JSON schema, greedy and sampled, with `n` candidates, and rows with different constraints (and a
free row) share one call. Served (`backend=vllm_serve`): each request body carries its row's `structured_outputs`
(the loopback server, no vLLM needed), and a real `vllm serve` of the same model (marked `vllm`) honours them.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from vllm_real import CHATS, ENGINE_OPTIONS, TINY64, steered, vllm_server

from steer_hydra.controls.output import ConstrainedDecoding
from steer_hydra.core import BackendSpec

REGEX = r"(cat|dog)-[0-9]{1,3}"
CHOICES = ["yes", "no", "maybe so"]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer", "n"],
    "additionalProperties": False,
}
# llguidance in the engine too, with compact JSON (an engine setting; ConstrainedDecoding.compact_json is its Hugging
# Face twin): a random model otherwise spends its budget on whitespace
OPTIONS = {**ENGINE_OPTIONS, "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True}}


def on_engine(test):
    """Mark a test that runs a real vLLM engine (skipped where vLLM is not importable)."""
    for mark in (
        pytest.mark.vllm,
        pytest.mark.timeout(900),
        pytest.mark.filterwarnings("ignore::DeprecationWarning"),
        pytest.mark.filterwarnings("ignore::FutureWarning"),
    ):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def engine():
    """The tiny64 model on an offline vLLM engine with a ConstrainedDecoding that constrains nothing by itself."""
    with steered(TINY64, [ConstrainedDecoding()], BackendSpec("vllm", OPTIONS)) as pipeline:
        yield pipeline


def _texts(pipeline, runtime_kwargs, chats=CHATS[:4], **kwargs):
    outputs = pipeline.generate(
        messages=chats, runtime_kwargs=runtime_kwargs, return_output=True, max_new_tokens=24, **kwargs
    )
    return [text for o in outputs for text in o.decode(pipeline.tokenizer)]


def _valid(kind: str, text: str) -> bool:
    if kind == "constrain_regex":
        return re.fullmatch(REGEX, text) is not None
    if kind == "constrain_choices":
        return text in CHOICES
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


VALUES = {"constrain_regex": REGEX, "constrain_choices": CHOICES, "constrain_json_schema": SCHEMA}


@pytest.mark.parametrize("kind", list(VALUES))
@pytest.mark.parametrize("draw", [{}, {"do_sample": True, "temperature": 1.3, "seed": 5, "n": 2}], ids=["greedy", "n2"])
@on_engine
def test_outputs_satisfy_each_kind_of_constraint(engine, kind, draw):
    texts = _texts(engine, {kind: VALUES[kind]}, **draw)
    assert len(texts) == 4 * draw.get("n", 1)
    assert all(_valid(kind, t) for t in texts), texts
    assert not all(_valid(kind, t) for t in _texts(engine, {}, **draw))  # unconstrained rows do not comply


def _one_constraint_per_row(pipeline) -> list[str]:
    """Each kind of constraint on its own row of one call, the fourth row free: each constrained row satisfies its
    constraint and the free row decodes as it does without any; the call's texts."""
    kinds = list(VALUES)
    kwargs = {kind: [VALUES[kind] if i == k else None for i in range(4)] for k, kind in enumerate(kinds)}
    texts = _texts(pipeline, kwargs)
    assert all(_valid(kind, texts[k]) for k, kind in enumerate(kinds)), texts
    assert texts[3] == _texts(pipeline, {})[3]  # the row without a constraint is untouched
    return texts


@on_engine
def test_per_row_constraints_share_one_call_and_a_free_row_decodes_freely(engine):
    texts = _one_constraint_per_row(engine)
    assert all(_texts(engine, {kind: VALUES[kind]}, [CHATS[k]])[0] == texts[k] for k, kind in enumerate(VALUES))


def test_served_requests_carry_each_rows_structured_outputs(serve_client, loopback):
    client = serve_client([ConstrainedDecoding()])
    kwargs = {"constrain_choices": [CHOICES, None, None], "constrain_json_schema": [None, SCHEMA, None]}
    client.generate(text=["a b", "c d e f", "g"], runtime_kwargs=kwargs, max_new_tokens=4)
    bodies = sorted((r.body for r in loopback.completion_requests()), key=lambda b: len(b["prompt"]))
    assert [b.get("structured_outputs") for b in bodies] == [None, {"choice": CHOICES}, {"json": SCHEMA}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`vllm serve` of the tiny64 model (llguidance, compact JSON) on a free loopback port; a pipeline on it."""
    log = tmp_path_factory.mktemp("vllm_serve_constrained") / "server.log"
    args = ["--structured-outputs-config", json.dumps(OPTIONS["structured_outputs_config"])]
    with (
        vllm_server(TINY64, args, log) as (base_url, _),
        steered(TINY64, [ConstrainedDecoding()], BackendSpec("vllm_serve", {"base_url": base_url})) as pipeline,
    ):
        yield pipeline


@on_engine
def test_a_real_server_honours_each_rows_constraint(served):
    _one_constraint_per_row(served)
    sampled = _texts(served, {"constrain_choices": CHOICES}, do_sample=True, temperature=1.3, seed=2, n=2)
    assert len(sampled) == 8 and all(t in CHOICES for t in sampled)
