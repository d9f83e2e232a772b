"""DeAL on the tiny model: the rollout bound, the best sequence seen, eos-finished beams, and backend verdicts."""

from __future__ import annotations

import pytest

from steer_hydra.controls.output import BestOfN, DeAL
from steer_hydra.core import SteeringPipeline, UnsupportedPipelineError
from steer_hydra.models import TINY_REF

CHAT = [{"role": "user", "content": "what is the capital of france"}]


def reward(text: str) -> float:
    """Deterministic and not monotone in length: vowels minus a length penalty."""
    return sum(text.count(v) for v in "aeiou") - 0.3 * len(text)


@pytest.mark.parametrize("max_new_tokens", [7, 40])
def test_rollouts_stay_within_the_bound_and_the_best_seen_is_returned(
    make_pipeline, recording_scorer, record_generate, max_new_tokens
):
    scorer = recording_scorer(reward)
    deal = DeAL(lookahead=3, init_beams=3, topk=2, max_iterations=4, reward_func=scorer)
    pipeline = make_pipeline([deal])
    calls = record_generate(pipeline.model)
    output = pipeline.generate(messages=CHAT, max_new_tokens=max_new_tokens, return_output=True)

    rollouts = sum(call["sequences"].shape[0] for call in calls)
    assert 0 < rollouts <= deal.max_rollouts_per_query() == 3 * (1 + 3 * 2)
    assert all(c["kwargs"]["num_beams"] == 3 and c["kwargs"]["num_return_sequences"] == 3 for c in calls)
    assert all(c["kwargs"]["max_new_tokens"] <= 3 for c in calls)
    assert rollouts == sum(len(texts) for _, texts, _ in scorer.calls)  # every rollout was scored
    (text,) = output.decode(pipeline.tokenizer)
    seen = scorer.seen
    assert text in [t for t, _ in seen]
    assert reward(text) == max(score for _, score in seen)
    assert output.output_ids.shape[1] <= min(max_new_tokens, 3 * 4)
    assert output.generated_tokens >= output.output_ids.shape[1]


def test_beams_finished_by_eos_end_the_search(make_pipeline, recording_scorer, record_generate, step_controls):
    # a composed output control forces eos as the 5th new token: every beam finishes in the second iteration
    scorer = recording_scorer(len)
    force = step_controls["force_after"](2, after=4)  # the tiny tokenizer's eos id is 2
    deal = DeAL(lookahead=3, init_beams=3, topk=2, max_iterations=10, reward_func=scorer)
    pipeline = make_pipeline([deal, force])
    assert pipeline.tokenizer.eos_token_id == 2
    calls = record_generate(pipeline.model)
    output = pipeline.generate(messages=CHAT, max_new_tokens=50, return_output=True)
    assert len(calls) == 2  # the processor applied inside the rollouts, so beams ended and the search stopped
    assert sum(call["sequences"].shape[0] for call in calls) == 3 + 2 * 3 < deal.max_rollouts_per_query()
    for call in calls[1:]:
        new = call["sequences"][:, call["input_ids"].shape[1] :]
        assert (new[:, 1] == 2).all()  # token 5 of every beam is eos
    ids = output.output_ids[0].tolist()
    assert output.finish_reasons == ["eos" if ids[-1] == 2 else None]
    assert len(pipeline.tokenizer.decode(ids, skip_special_tokens=True)) == max(len(t) for t, _ in scorer.seen)


def test_deal_is_hugging_face_only_and_check_says_so():
    deal = DeAL(reward_func=lambda p, c, params: [0.0] * len(c))
    pipeline = SteeringPipeline(TINY_REF, controls=[deal], backend="vllm")
    report = pipeline.check()
    assert not report.ok
    (failure,) = report.failures
    assert failure.control == "DeAL" and "beam_proposals" in failure.message
    assert "backend=huggingface" in failure.message
    assert pipeline.check("huggingface").ok
    # sampled reranking has no such restriction
    best = BestOfN(n=2, scorer=lambda p, c, params: [0.0] * len(c))
    assert SteeringPipeline(TINY_REF, controls=[best], backend="vllm").check().ok


@pytest.mark.filterwarnings("ignore:Runtime kwarg 'reward_params' is read by several controls")
def test_two_drivers_are_reported_by_check_and_refused_by_steer(tiny):
    model, tok = tiny
    score = lambda p, c, params: [0.0] * len(c)  # noqa: E731
    pipeline = SteeringPipeline(
        model=model, tokenizer=tok, controls=[BestOfN(n=2, scorer=score), DeAL(reward_func=score)]
    )
    (failure,) = pipeline.check().failures
    assert failure.control == "DeAL"
    assert "only one DecodingDriver" in failure.message and "BestOfN, DeAL" in failure.message
    with pytest.raises(UnsupportedPipelineError, match="only one DecodingDriver may be enabled"):
        pipeline.steer()
    disabled = [BestOfN(n=2, scorer=score), DeAL(reward_func=score, enabled=False)]
    assert SteeringPipeline(model=model, tokenizer=tok, controls=disabled).check().ok
