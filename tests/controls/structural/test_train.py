"""The trainer controls (TRL SFT and DPO) on the tiny model: the trained adapter acts and moves the model the way its
objective says, it is reused from the cache by digest (zero steps the second time) and retrained when the data
changes, the trainer receives the training split only, a killed training leaves no cache entry and resumes from its
checkpoint, full-weight training swaps weights and restores them, and the vLLM preparation trains once then serves
from the cache without loading the model."""

from __future__ import annotations

import json

import pytest
import torch

from steer_hydra.controls.structural import DPOAdapter, SFTAdapter
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.identity import config_digest
from steer_hydra.core.sweeps import config_descriptor_from_controls
from steer_hydra.models import build_tiny_model, resolve_model_reference

pytest.importorskip("trl")
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

PAIRS = [
    {"prompt": "tell me about the cat", "positive": "the cat is kind and calm", "negative": "the cat is cruel"},
    {"prompt": "tell me about the dog", "positive": "the dog is kind and calm", "negative": "the dog is rude"},
    {"prompt": "tell me about the bird", "positive": "the bird is kind and calm", "negative": "the bird is angry"},
    {"prompt": "tell me about the fish", "positive": "the fish is kind and calm", "negative": "the fish is bad"},
]
HELD_OUT = [
    {"prompt": "DEV what is the capital of france", "positive": "DEV paris", "negative": "DEV rome", "split": "dev"},
    {"prompt": "TEST name a river", "positive": "TEST the sea", "negative": "TEST a road", "split": "test"},
]
FAST = {"max_steps": 3, "learning_rate": 1e-2, "batch_size": 4, "save_steps": 100}


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _greedy(pipeline) -> list[str]:
    return pipeline.generate(text=["tell me about the cat", "hello"], max_new_tokens=8, do_sample=False)


def _steer(control):
    model, tokenizer = build_tiny_model()
    return SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()


def _logp(model, tokenizer, prompt: str, answer: str) -> float:
    """Sum of the answer tokens' log-probabilities after the chat-templated prompt."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    full = torch.tensor([list(ids) + answer_ids])
    with torch.no_grad():
        logits = model(full).logits.log_softmax(-1)[0]
    start = len(ids)
    return float(sum(logits[start + i - 1, t] for i, t in enumerate(answer_ids)))


def test_sft_adapter_is_reused_by_digest_and_a_changed_dataset_retrains(tmp_path):
    data = _write(tmp_path / "pairs.jsonl", PAIRS)
    plain = _greedy(SteeringPipeline(model=build_tiny_model()[0], tokenizer=build_tiny_model()[1]).steer())
    first = SFTAdapter(data=data, cache_dir=str(tmp_path / "cache"), **FAST)
    pipeline = _steer(first)
    trained = _greedy(pipeline)
    assert first.trained_steps == 3 and trained != plain
    assert first.training_record["global_step"] == 3
    pipeline.release()

    second = SFTAdapter(data=data, cache_dir=str(tmp_path / "cache"), **FAST)
    pipeline = _steer(second)
    assert second.trained_steps == 0 and second.artifact_path == first.artifact_path  # zero steps: from the cache
    assert _greedy(pipeline) == trained and second.vector_hash == first.vector_hash
    assert second.provenance()["trained_steps"] == 0 and second.provenance()["training"]["global_step"] == 3
    pipeline.release()
    id_before = config_digest(config_descriptor_from_controls([second]))

    _write(tmp_path / "pairs.jsonl", [*PAIRS, {"prompt": "tell me about the sun", "positive": "the sun is calm"}])
    third = SFTAdapter(data=data, cache_dir=str(tmp_path / "cache"), **FAST)
    assert config_digest(config_descriptor_from_controls([third])) != id_before  # the file's content is identity
    pipeline = _steer(third)
    assert third.trained_steps == 3 and third.artifact_path != first.artifact_path
    pipeline.release()


@pytest.mark.parametrize("control_cls", [SFTAdapter, DPOAdapter], ids=["sft", "dpo"])
def test_the_trainer_receives_the_training_split_only(tmp_path, monkeypatch, control_cls):
    import trl

    received = []
    name = "SFTTrainer" if control_cls is SFTAdapter else "DPOTrainer"
    original = getattr(trl, name)

    class Recording(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs):
            received.append(kwargs["train_dataset"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(trl, name, Recording)
    rows = [{**r, "split": "train"} for r in PAIRS] + HELD_OUT
    control = control_cls(data=_write(tmp_path / "rows.jsonl", rows), cache_dir=str(tmp_path / "c"), **FAST)
    _steer(control).release()
    (dataset,) = received
    text = json.dumps(dataset.to_list())
    assert len(dataset) == len(PAIRS) and "DEV" not in text and "TEST" not in text
    assert all(p["prompt"] in text for p in PAIRS)


def test_dpo_raises_the_chosen_answers_margin_over_the_rejected(tmp_path):
    model, tokenizer = build_tiny_model()

    def margin(m) -> float:
        return sum(
            _logp(m, tokenizer, p["prompt"], p["positive"]) - _logp(m, tokenizer, p["prompt"], p["negative"])
            for p in PAIRS
        )

    before = margin(model)
    control = DPOAdapter(data=PAIRS, beta=0.1, cache_dir=str(tmp_path), **FAST)
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    after = margin(model)
    assert control.trained_steps == 3 and after > before + 1.0, (before, after)
    pipeline.release()
    assert margin(model) == pytest.approx(before, abs=1e-5)  # the base back


def test_a_killed_training_leaves_no_entry_and_resumes_from_its_checkpoint(tmp_path):
    from transformers import TrainerCallback

    class Killed(Exception):
        pass

    class KillAfterFirstCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            raise Killed(state.global_step)

    settings = {**FAST, "max_steps": 4, "save_steps": 2}
    first = SFTAdapter(data=PAIRS, cache_dir=str(tmp_path), **settings)
    first.trainer_callbacks.append(KillAfterFirstCheckpoint())
    with pytest.raises(Killed):
        _steer(first)
    adapters = tmp_path / "adapters"
    assert [p.name for p in adapters.iterdir() if not p.name.startswith(".")] == []  # no entry
    (partial,) = [p for p in adapters.iterdir() if p.name.endswith(".partial")]
    assert (partial / "checkpoints" / "checkpoint-2").is_dir()

    again = SFTAdapter(data=PAIRS, cache_dir=str(tmp_path), **settings)
    pipeline = _steer(again)
    assert (again.resumed_from_step, again.trained_steps) == (2, 2)
    assert again.training_record["global_step"] == 4 and not partial.exists()
    pipeline.release()


def test_full_weight_training_swaps_weights_and_restores_them(tmp_path):
    model, tokenizer = build_tiny_model()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    control = SFTAdapter(data=PAIRS, full=True, cache_dir=str(tmp_path), **FAST)
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    changed = [k for k, v in base.items() if not torch.equal(model.state_dict()[k], v)]
    assert len(changed) > len(base) // 2 and control.vector_hash
    pipeline.release()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in base.items())
    report = SteeringPipeline("steer_hydra:tiny", controls=[control], backend="vllm").check()
    assert any("full=true" in m for m in report.messages())


def test_vllm_preparation_trains_once_then_serves_from_the_cache_without_a_model(tmp_path, monkeypatch):
    path = resolve_model_reference("steer_hydra:tiny")
    _, tokenizer = build_tiny_model()
    first = SFTAdapter(data=PAIRS, cache_dir=str(tmp_path), **FAST)
    first.prepare_for_engine(path, tokenizer)
    artifact = first.export_lora()
    assert first.trained_steps == 3 and artifact.path == str(first.artifact_path)

    import transformers

    def no_load(*args, **kwargs):
        raise AssertionError("a cached adapter must not load the model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    second = SFTAdapter(data=PAIRS, cache_dir=str(tmp_path), **FAST)
    second.prepare_for_engine(path, tokenizer)
    assert second.trained_steps == 0 and second.export_lora().sha256 == artifact.sha256
    # the same key as on Hugging Face: an adapter trained there is served here (and the other way round)
    monkeypatch.undo()
    hf = SFTAdapter(data=PAIRS, cache_dir=str(tmp_path), **FAST)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    SteeringPipeline(model=model, tokenizer=tokenizer, controls=[hf]).steer().release()
    assert hf.trained_steps == 0 and hf.artifact_path == first.artifact_path
    assert SteeringPipeline("steer_hydra:tiny", controls=[hf], backend="vllm").check().ok


def test_args_are_checked():
    with pytest.raises(ValueError, match="max_steps"):
        SFTAdapter(data=PAIRS, max_steps=0)
    with pytest.raises(ValueError, match="beta"):
        DPOAdapter(data=PAIRS, beta=0)
    with pytest.raises(ValueError, match="no rows"):
        SFTAdapter(data=[])
    with pytest.raises(ValueError, match="no training rows"):
        SFTAdapter(data=HELD_OUT).source_rows()
    with pytest.raises(ValueError, match="rejected"):
        DPOAdapter(data=[{"prompt": "a", "chosen": "b"}]).training_rows(build_tiny_model()[1])


@pytest.mark.parametrize("concept", ["weddings", "french"])
def test_a_concept_arm_trains_on_the_concepts_pairs_never_on_the_task_instructions(concept):
    from steer_hydra.tasks.concept_steering import concept_samples
    from steer_hydra.tasks.concepts import concept_pairs

    _, tokenizer = build_tiny_model()
    for control_cls in (SFTAdapter, DPOAdapter):
        rows = control_cls(data=concept_pairs(concept)).training_rows(tokenizer)
        prompts = {row["prompt"][0]["content"] for row in rows}
        evaluated = {sample.metadata["instruction"] for sample in concept_samples(concept, split="all")}
        assert len(prompts) >= 16 and not prompts & evaluated
        if control_cls is SFTAdapter:  # AxBench's SFT arm: the concept's positive answers
            assert {row["completion"][0]["content"] for row in rows} == {p["positive"] for p in concept_pairs(concept)}


@pytest.mark.slow
def test_a_lora_trained_on_smollm2_is_served_merged_and_reused(tmp_path):
    """SmolLM2 (tied embeddings, its own chat template), offline: two SFT steps of a small LoRA, applied merged, the
    base restored at release, and the second steer trains nothing."""
    rows = [{"prompt": "What is the capital of France?", "response": "Paris, of course!"}] * 2
    settings = {
        "max_steps": 2,
        "batch_size": 2,
        "lora_r": 2,
        "target_modules": ["q_proj", "v_proj"],
        "learning_rate": 1e-3,
        "max_length": 64,
        "save_steps": 100,
        "cache_dir": str(tmp_path),
    }
    pipeline = SteeringPipeline("steer_hydra:smollm2", controls=[SFTAdapter(data=rows, **settings)]).steer()
    model = pipeline.model
    probe = model.model.layers[0].self_attn.q_proj.weight
    merged = probe.detach().clone()
    answer = pipeline.generate(
        messages=[{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=12, do_sample=False
    )
    assert pipeline.controls[0].trained_steps == 2 and "Paris" in answer
    pipeline.release()
    assert not torch.equal(probe.detach(), merged)  # the base's weights are back in place
    again = SFTAdapter(data=rows, **settings)
    SteeringPipeline("steer_hydra:smollm2", controls=[again]).steer().release()
    assert again.trained_steps == 0
