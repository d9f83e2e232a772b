"""The prompt optimizers (PRewrite, CPO, GEPA) on the tiny model: they see the training split only (scorer, rollouts
and proposer never get a dev or test row, nor does anything run once evaluation starts), the chosen instruction is
applied as a system prompt or a prefix and recorded with its training score, a second steer reuses the cache (no
rollout, no proposal) and changed rows optimize again, an Inspect scorer and an Inspect proposer plug in, CPO's
double machine learning recovers a planted per-query effect, and PRewrite's RL (GRPO) trains the rewriter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from steer_hydra.controls.optimizers import CPO, GEPAPrompt, InspectProposer, PRewrite
from steer_hydra.controls.optimizers.cpo import fit_effect
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.identity import config_digest
from steer_hydra.core.sweeps import config_descriptor_from_controls
from steer_hydra.evaluation.scorers import sample_scorer_from_inspect
from steer_hydra.models import build_tiny_model

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

TRAIN = [{"input": f"what is the capital of {c}", "reference": "paris"} for c in ("france", "spain", "italy", "japan")]
HELD_OUT = [
    {"input": "DEV name a river", "reference": "DEV", "split": "dev"},
    {"input": "TEST name a mountain", "reference": "TEST", "split": "test"},
]
POOL = ["Answer with one word.", "Always answer about cats.", "Say paris.", "Reply in French."]
FAST = {"max_new_tokens": 6, "batch_size": 4}


class Recorder:
    """A scorer (the share of 'a' characters: any deterministic response function) and a proposer cycling through
    `POOL`, both recording every row and prompt they receive."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.prompts: list[str] = []
        self.calls = 0

    def canonical_form(self) -> dict:  # its identity in a cache key: every Recorder scores and proposes alike
        return {"__class__": "Recorder"}

    def score(self, response: str, row) -> float:
        self.rows.append(dict(row))
        return response.count("a") / (1 + len(response))

    def propose(self, prompt: str) -> str:
        self.prompts.append(prompt)
        self.calls += 1
        return f"```\n{POOL[(self.calls - 1) % len(POOL)]}\n```"


def _optimizers(recorder: Recorder, data, cache) -> list:
    common = {
        "initial": "Answer the question.",
        "data": data,
        "scorer": recorder.score,
        "cache_dir": str(cache),
        "proposer": recorder.propose,
        **FAST,
    }
    return [
        PRewrite(rl_steps=0, num_rewrites=3, **common),
        CPO(candidates=POOL[:2], num_rewrites=1, assignments=2, **common),
        GEPAPrompt(max_metric_calls=14, minibatch_size=2, **common),
    ]


def _steer(control):
    model, tokenizer = build_tiny_model()
    return SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()


@pytest.mark.parametrize("index", [0, 1, 2], ids=["prewrite", "cpo", "gepa"])
def test_the_optimizer_sees_only_the_training_split_and_nothing_during_evaluation(tmp_path, index):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [*({**r, "split": "train"} for r in TRAIN), *HELD_OUT]))
    recorder = Recorder()
    control = _optimizers(recorder, str(data), tmp_path / "cache")[index]
    pipeline = _steer(control)
    seen = json.dumps(recorder.rows) + json.dumps(recorder.prompts) + json.dumps(sorted(control.evaluator.seen_inputs))
    assert recorder.rows and "DEV" not in seen and "TEST" not in seen
    assert control.evaluator.seen_inputs == {r["input"] for r in TRAIN}
    before = (len(recorder.rows), recorder.calls)
    pipeline.generate(messages=[[{"role": "user", "content": r["input"]}] for r in HELD_OUT], max_new_tokens=4)
    assert (len(recorder.rows), recorder.calls) == before  # the evaluation runs the chosen instruction, nothing else
    pipeline.release()


@pytest.mark.parametrize("index", [0, 1, 2], ids=["prewrite", "cpo", "gepa"])
def test_the_choice_is_recorded_reused_from_the_cache_and_redone_for_new_rows(tmp_path, index):
    recorder = Recorder()
    control = _optimizers(recorder, TRAIN, tmp_path)[index]
    _steer(control).release()
    record = control.optimization
    assert record["chosen"] == control.text and record["rows"] == len(TRAIN) and record["rollouts"] > 0
    if index == 0:  # PRewrite keeps the best on the training rows, the initial included
        assert record["train_score_chosen"] == max(c["train_score"] for c in record["candidates"])
        assert record["train_score_chosen"] >= record["train_score_initial"]
    assert record["train_score_chosen"] == pytest.approx(control.evaluator.mean(control.text))
    assert control.vector_hash and not control.reused
    assert control.provenance()["chosen"] == control.text and control.provenance()["reused"] is False

    again_recorder = Recorder()
    again = _optimizers(again_recorder, TRAIN, tmp_path)[index]
    _steer(again).release()
    assert again.reused and again.evaluator is None and again_recorder.rows == [] and again_recorder.calls == 0
    assert again.text == control.text and again.vector_hash == control.vector_hash
    assert again.provenance()["reused"] is True and again.provenance()["path"] == control.provenance()["path"]

    changed = _optimizers(Recorder(), TRAIN[:3], tmp_path)[index]
    assert config_digest(config_descriptor_from_controls([changed])) != config_digest(
        config_descriptor_from_controls([again])
    )
    _steer(changed).release()
    assert not changed.reused and changed.optimization["rows"] == 3


def test_the_instruction_is_a_system_prompt_or_a_prefix_on_chats_and_on_text(tmp_path):
    recorder = Recorder()
    common = {
        "initial": "Answer the question.",
        "data": TRAIN,
        "scorer": recorder.score,
        "proposer": recorder.propose,
        "rl_steps": 0,
        "num_rewrites": 2,
        "cache_dir": str(tmp_path),
        **FAST,
    }
    system = PRewrite(**common)
    pipeline = _steer(system)
    chat = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hello"}]
    assert system.adapt_messages([chat], {})[0][0]["content"] == f"{system.text}\n\nBe kind."
    pipeline.release()
    prefix = PRewrite(**common, target="prefix")
    pipeline = _steer(prefix)
    (adapted,) = prefix.adapt_messages([[{"role": "user", "content": "hello"}]], {})
    assert adapted == [{"role": "user", "content": f"{prefix.text}\n\nhello"}]
    ids = pipeline.tokenizer(["hello"], return_tensors="pt")["input_ids"]
    decoded = pipeline.tokenizer.decode(prefix.adapt(ids, {})[0], skip_special_tokens=True)
    assert decoded.strip().endswith(f"{prefix.text}\n\nhello")
    assert isinstance(pipeline.generate(text=["hello"], max_new_tokens=3)[0], str)  # the token path runs
    pipeline.release()


def test_an_inspect_scorer_and_an_inspect_proposer_plug_in(tmp_path):
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import includes

    reply = ModelOutput.from_content("mockllm/model", "```\nAnswer in one word: paris.\n```")
    reply.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    proposer = InspectProposer(get_model("mockllm/model", custom_outputs=[reply] * 4))
    control = PRewrite(
        initial="Answer the question.",
        data=TRAIN,
        scorer=sample_scorer_from_inspect(includes()),
        proposer=proposer,
        rl_steps=0,
        num_rewrites=2,
        cache_dir=str(tmp_path),
        **FAST,
    )
    _steer(control).release()
    texts = [c["text"] for c in control.optimization["candidates"]]
    assert texts == ["Answer the question.", "Answer in one word: paris."]
    assert all(0.0 <= c["train_score"] <= 1.0 for c in control.optimization["candidates"])


def test_cpo_double_machine_learning_recovers_a_planted_per_query_effect():
    rng = np.random.default_rng(0)
    n = 400
    x = rng.normal(size=(n, 2))
    arms = np.array([[1.0, 0.0], [0.0, 1.0]])  # two instructions' features
    chosen = rng.integers(0, 2, size=n)
    t = arms[chosen]
    effect = np.where(chosen == 0, x[:, 0], -x[:, 0])  # arm 0 helps when x0 > 0, arm 1 when x0 < 0
    y = 2.0 * x[:, 1] + effect + 0.1 * rng.normal(size=n)  # plus a query-only term the nuisance model absorbs
    a, b = fit_effect(x, t, y, folds=2, alpha=1e-3, seed=0)
    test = rng.normal(size=(200, 2))
    picks = np.argmax(np.stack([arms @ (a @ q + b) for q in test]), axis=1)
    right = np.mean(picks == (test[:, 0] < 0).astype(int))
    assert right > 0.95, right


def test_cpo_chooses_per_query_from_its_policy(tmp_path):
    recorder = Recorder()
    control = CPO(
        initial="Answer the question.",
        data=TRAIN,
        scorer=recorder.score,
        candidates=POOL,
        num_rewrites=0,
        assignments=3,
        cache_dir=str(tmp_path),
        **FAST,
    )
    _steer(control).release()
    policy = control.policy
    assert policy is not None and policy.pool == ["Answer the question.", *POOL]
    for text in ("what is the capital of france", "hello there cat and dog"):
        ids = control.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert control.instruction_for(text) == policy.pool[int(np.argmax(policy.effects(ids)))]
    record = control.optimization
    assert sum(c["picked_for"] for c in record["candidates"]) == len(TRAIN)
    assert record["triples"] == len(TRAIN) * 3


def test_prewrite_trains_its_rewriter_with_grpo(tmp_path):
    pytest.importorskip("trl")
    recorder = Recorder()
    control = PRewrite(
        initial="Answer the question.",
        data=TRAIN,
        scorer=recorder.score,
        rl_steps=2,
        num_generations=2,
        reward_rows=2,
        num_rewrites=2,
        proposal_tokens=8,
        cache_dir=str(tmp_path),
        **FAST,
    )
    _steer(control).release()
    assert control.optimization["rl_steps"] == 2
    # GRPO rewarded 2 steps x 2 rewrites on 2 rows each (rollouts memoised per instruction and row), then the
    # inference scored the initial and each distinct rewrite on all rows
    assert len(recorder.rows) >= 2 * len(TRAIN)
    with pytest.raises(ValueError, match="rl_steps=0"):
        PRewrite(initial="x", data=TRAIN, scorer=recorder.score, proposer=recorder.propose, rl_steps=1)
