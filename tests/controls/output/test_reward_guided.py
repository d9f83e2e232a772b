"""RewardGuidedDecoding (RAD): the per-step formula, the cached reward path against full sequences, the re-tokenized
path, batching with left padding, beta's effect, refusals, release."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

from steer_hydra.controls.output import RewardGuidedDecoding, RewardLogitsProcessor
from steer_hydra.controls.output.reward_guided import reward_from_logits, sequence_rewards
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.capabilities import UnsupportedPipelineError
from steer_hydra.models import TINY_REF, TINY_REWARD_REF, build_tiny_model
from steer_hydra.models.tiny import parse_tiny_reference

REWARD = f"{TINY_REWARD_REF}?seed=3"  # the tiny tokenizer under a random classification head
OTHER_VOCAB = f"{TINY_REWARD_REF}?seed=3&vocab_size=512"  # another tokenizer: the re-tokenizing path
PROMPTS = ["hello there cat and dog", "a", "what is the capital of france"]
GREEDY = {"max_new_tokens": 6, "do_sample": False}


def _ids(output, pad: int) -> list[int]:
    row = output.output_ids[0].tolist()
    while row and row[-1] == pad:
        row.pop()
    return row


def _step_inputs(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's next-token logits on left-padded `ids` (prompt `mask`, generated tokens counting) and the mask."""
    extra = torch.ones(ids.shape[0], ids.shape[1] - mask.shape[1], dtype=mask.dtype)
    full = torch.cat([mask, extra], 1)
    positions = (full.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=full, position_ids=positions).logits[:, -1], full


def test_processor_scores_equal_the_formula_from_both_models():
    model, tok = build_tiny_model()
    reward, _ = build_tiny_model(parse_tiny_reference(REWARD))
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (mask == 0).any()  # left padding is exercised
    beta, k = 7.0, 5
    processor = RewardLogitsProcessor(reward, ids, mask, beta=beta, top_k=k)
    for _ in range(3):
        logits, full = _step_inputs(model, ids, mask)
        got = processor(ids, logits.clone())
        top = logits.topk(k, dim=-1)
        # each candidate sequence scored on its own by the reward model's own forward (no cache, no padding; from
        # embeddings, so its pooling reads the last position even when the candidate is the pad token)
        want = torch.full_like(logits, -math.inf)
        for row in range(ids.shape[0]):
            prefix = ids[row][full[row].bool()]
            for value, token in zip(top.values[row], top.indices[row], strict=True):
                embeds = reward.get_input_embeddings()(torch.cat([prefix, token.view(1)]).unsqueeze(0))
                with torch.no_grad():
                    head = reward(inputs_embeds=embeds).logits
                want[row, token] = value + beta * torch.softmax(head, -1)[0, -1]
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and int(torch.isfinite(got).sum()) == 3 * k
        assert torch.allclose(got[torch.isfinite(got)], want[torch.isfinite(want)], atol=1e-4)
        shift = got.gather(1, top.indices) - top.values
        assert float(shift.std()) > 0.05  # the reward differs between candidates
        ids = torch.cat([ids, got.argmax(-1, keepdim=True)], 1)


def test_cached_rewards_equal_full_sequence_scoring_in_chunks_and_after_a_reprefill():
    model, tok = build_tiny_model()
    reward, _ = build_tiny_model(parse_tiny_reference(REWARD))
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def uncached(ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        _, full = _step_inputs(model, ids, mask)
        sequences = torch.cat([ids.repeat_interleave(4, 0), candidates.reshape(-1, 1)], 1)
        ones = torch.ones(sequences.shape[0], 1, dtype=full.dtype)
        return sequence_rewards(reward, sequences, torch.cat([full.repeat_interleave(4, 0), ones], 1)).view(-1, 4)

    processor = RewardLogitsProcessor(reward, ids, mask, beta=1.0, top_k=4, reward_batch_size=5)  # 2 rows a chunk
    for _ in range(4):
        candidates = _step_inputs(model, ids, mask)[0].topk(4, dim=-1).indices
        assert torch.allclose(processor.rewards(ids, candidates), uncached(ids, candidates), atol=1e-5)
        ids = torch.cat([ids, candidates[:, :1]], 1)
    # a sequence that does not extend the cached one (row 0 branches at its last token): prefilled again
    branched = ids.clone()
    branched[0, -1] = candidates[0, 1]
    assert processor.rewards(branched, candidates).shape == (3, 4)
    assert torch.allclose(processor.rewards(branched, candidates), uncached(branched, candidates), atol=1e-5)
    assert torch.allclose(processor.rewards(ids, candidates), uncached(ids, candidates), atol=1e-5)


def test_retokenized_rewards_score_the_decoded_text_with_the_reward_tokenizer():
    model, tok = build_tiny_model()
    reward, reward_tok = build_tiny_model(parse_tiny_reference(OTHER_VOCAB))
    assert tok.get_vocab() != reward_tok.get_vocab()
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    processor = RewardLogitsProcessor(reward, ids, mask, beta=1.0, top_k=3, tokenizers=(tok, reward_tok))
    logits, full = _step_inputs(model, ids, mask)
    candidates = logits.topk(3, dim=-1).indices
    got = processor.rewards(ids, candidates)
    for row in range(ids.shape[0]):
        for j, token in enumerate(candidates[row]):
            text = tok.decode(torch.cat([ids[row][full[row].bool()], token.view(1)]), skip_special_tokens=True)
            encoded = reward_tok(text, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                want = torch.softmax(reward(input_ids=encoded).logits, -1)[0, -1]
            assert math.isclose(float(got[row, j]), float(want), abs_tol=1e-5)


def test_reward_from_logits_reads_the_label_or_a_single_logit():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    assert math.isclose(float(reward_from_logits(logits, None)), float(torch.softmax(logits, -1)[0, 2]), rel_tol=1e-6)
    assert math.isclose(float(reward_from_logits(logits, 0)), float(torch.softmax(logits, -1)[0, 0]), rel_tol=1e-6)
    assert math.isclose(float(reward_from_logits(torch.tensor([[0.5]]), None)), 1 / (1 + math.exp(-0.5)), rel_tol=1e-6)


def test_greedy_differs_from_unsteered_and_a_row_alone_equals_the_same_row_in_a_batch(make_pipeline):
    control = RewardGuidedDecoding(reward_model=REWARD, top_k=8, reward_batch_size=10)
    steered = make_pipeline([control])
    plain = make_pipeline([])
    pad = steered.tokenizer.pad_token_id
    assert control.uses_prefix_cache
    batched = steered.generate(text=PROMPTS, return_output=True, **GREEDY)
    unsteered = plain.generate(text=PROMPTS, return_output=True, **GREEDY)
    assert [_ids(o, pad) for o in batched] != [_ids(o, pad) for o in unsteered]
    for prompt, in_batch in zip(PROMPTS, batched, strict=True):
        assert _ids(steered.generate(text=prompt, return_output=True, **GREEDY), pad) == _ids(in_batch, pad)
    assert steered.supports_batching is True
    assert RewardGuidedDecoding.supports_refill is False
    assert steered.refill_blockers() == ["RewardGuidedDecoding runs live logits processors or stopping criteria"]


def test_beta_zero_is_the_base_models_greedy(make_pipeline):
    steered = make_pipeline([RewardGuidedDecoding(reward_model=REWARD, beta=0.0, top_k=3)])
    plain = make_pipeline([])
    assert steered.generate(text=PROMPTS, **GREEDY) == plain.generate(text=PROMPTS, **GREEDY)


def test_larger_beta_raises_the_mean_reward_of_greedy_outputs(make_pipeline):
    reward, _ = build_tiny_model(parse_tiny_reference(REWARD))
    prompts = [*PROMPTS, "tell me a story about the sea", "name three colors"]

    def mean_reward(beta: float) -> float:
        pipeline = make_pipeline([RewardGuidedDecoding(reward_model=REWARD, beta=beta)])
        pad = pipeline.tokenizer.pad_token_id
        scores = []
        for output in pipeline.generate(text=prompts, return_output=True, **GREEDY):
            prompt = output.adapted_input_ids[0]
            sequence = torch.cat([prompt[prompt != pad], torch.tensor(_ids(output, pad), dtype=prompt.dtype)])
            with torch.no_grad():
                scores.append(float(torch.softmax(reward(input_ids=sequence.unsqueeze(0)).logits, -1)[0, -1]))
        pipeline.release()
        return sum(scores) / len(scores)

    low, mid, high = mean_reward(0.0), mean_reward(3.0), mean_reward(30.0)
    assert low < mid < high and high - low > 0.1


def test_different_vocabulary_retokenizes_and_still_batches(make_pipeline):
    control = RewardGuidedDecoding(reward_model=OTHER_VOCAB, top_k=4)
    steered = make_pipeline([control])
    assert not control.uses_prefix_cache
    pad = steered.tokenizer.pad_token_id
    batched = steered.generate(text=PROMPTS[:2], return_output=True, max_new_tokens=3, do_sample=False)
    for prompt, in_batch in zip(PROMPTS[:2], batched, strict=True):
        alone = steered.generate(text=prompt, return_output=True, max_new_tokens=3, do_sample=False)
        assert _ids(alone, pad) == _ids(in_batch, pad)


def test_sampling_runs(make_pipeline):
    steered = make_pipeline([RewardGuidedDecoding(reward_model=REWARD, beta=10.0, top_k=5)])
    chats = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "what is the capital of france"}]]
    texts = steered.generate(messages=chats, max_new_tokens=4, do_sample=True, temperature=0.8, seed=3)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"beta": -1.0}, r"RewardGuidedDecoding.beta must be a finite number >= 0; got -1.0"),
        ({"beta": float("inf")}, r"RewardGuidedDecoding.beta"),
        ({"top_k": 0}, r"RewardGuidedDecoding.top_k must be >= 1; got 0"),
        ({"label": -1}, r"RewardGuidedDecoding.label must be a class index >= 0 or None"),
        ({"reward_batch_size": 0}, r"RewardGuidedDecoding.reward_batch_size must be >= 1 or None"),
        ({"reward_model": " "}, r"RewardGuidedDecoding.reward_model must name a sequence classifier"),
    ],
)
def test_invalid_args_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardGuidedDecoding(**{"reward_model": REWARD, **kwargs})


def test_reward_model_is_required_and_typed():
    with pytest.raises(TypeError, match="reward_model"):
        RewardGuidedDecoding()
    with pytest.raises(TypeError, match=r"RewardGuidedDecoding.top_k must be int"):
        RewardGuidedDecoding(reward_model=REWARD, top_k=2.5)


def test_label_beyond_the_reward_models_classes_is_refused_at_steer(make_pipeline):
    pipeline = make_pipeline([RewardGuidedDecoding(reward_model=f"{REWARD}&num_labels=1", label=1)], steer=False)
    with pytest.raises(ValueError, match=r"RewardGuidedDecoding.label=1 .* has 1 class\(es\). Fix: label in 0..0"):
        pipeline.steer()
    assert not pipeline.is_steered


def test_check_refuses_vllm_naming_the_fix():
    pipeline = SteeringPipeline(TINY_REF, controls=[RewardGuidedDecoding(reward_model=REWARD)], backend="vllm")
    report = pipeline.check()
    assert not report.ok
    (failure,) = report.failures
    assert failure.control == "RewardGuidedDecoding" and "in_process_torch" in failure.message
    assert "Fix: use backend=huggingface" in failure.message
    with pytest.raises(UnsupportedPipelineError, match="backend=huggingface"):
        pipeline.steer()
    assert SteeringPipeline(TINY_REF, controls=[RewardGuidedDecoding(reward_model=REWARD)]).check().ok


def test_processors_need_steer():
    with pytest.raises(RuntimeError, match=r"Fix: call pipeline.steer\(\) first"):
        RewardGuidedDecoding(reward_model=REWARD).get_logits_processors(torch.tensor([[1, 2]]), {})


def test_release_frees_the_reward_model():
    model, tokenizer = build_tiny_model()
    control = RewardGuidedDecoding(reward_model=REWARD)
    steered = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    reward = weakref.ref(control.reward)
    steered.generate(text=PROMPTS[:1], max_new_tokens=2, do_sample=False)
    steered.release()
    gc.collect()
    assert control.reward is None and reward() is None and not control.uses_prefix_cache


def test_an_encoder_classifier_scores_re_tokenized_text_even_with_the_same_vocabulary():
    from transformers import BertConfig, BertForSequenceClassification

    model, tok = build_tiny_model()
    _, reward_tok = build_tiny_model()  # the model's own vocabulary, but an encoder cannot use the prefix cache
    config = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        encoder = BertForSequenceClassification(config).eval()
    control = RewardGuidedDecoding(reward_model="encoder", label=0, top_k=3)
    control.steer(model, tokenizer=tok, load_model=lambda ref, **kwargs: (encoder, reward_tok))
    assert not control.uses_prefix_cache
    assert (reward_tok.padding_side, reward_tok.truncation_side) == ("right", "left")
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    (processor,) = control.get_logits_processors(ids, {}, attention_mask=mask)
    logits, full = _step_inputs(model, ids, mask)
    candidates = logits.topk(3, dim=-1).indices
    got = processor.rewards(ids, candidates)
    for row in range(ids.shape[0]):
        for j, token in enumerate(candidates[row]):
            text = tok.decode(torch.cat([ids[row][full[row].bool()], token.view(1)]), skip_special_tokens=True)
            with torch.no_grad():
                want = torch.softmax(encoder(input_ids=reward_tok(text, return_tensors="pt")["input_ids"]).logits, -1)
            assert math.isclose(float(got[row, j]), float(want[0, 0]), abs_tol=1e-5)
    control.cleanup()
    assert control.reward is None
