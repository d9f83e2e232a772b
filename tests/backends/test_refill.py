"""RefillEngine through the pipeline: token identity with static batching, per-row steering, seeds, blockers."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, PASTA, ActAdd

PROMPTS = [
    "the cat and dog",
    "tell me a story about paris in france please",
    "sum",
    "the river meets the sea and the sun is red today",
    "where is the city of paris",
    "a happy bird can read",
]
LIMITS = [5, 30, 12, 20, 3, 25]
SUBSTRINGS = [["cat"], ["paris"], ["sum"], ["river"], ["city"], ["bird"]]


def chats(indices):
    return [[{"role": "user", "content": PROMPTS[i]}] for i in indices]


def static_rows(pipeline, indices, limits, runtime_kwargs=None, **gen_kwargs):
    """What static batching returns for these rows, each cut to its own limit (trailing pads dropped)."""
    outputs = pipeline.generate(
        messages=chats(indices),
        return_output=True,
        max_new_tokens=max(limits),
        runtime_kwargs=runtime_kwargs,
        **gen_kwargs,
    )
    pad = pipeline.tokenizer.pad_token_id
    rows = []
    for output, limit in zip(outputs, limits, strict=True):
        row = output.output_ids[0].tolist()[:limit]
        while row and row[-1] == pad:
            row.pop()
        rows.append(row)
    return rows


def refill_rows(pipeline, indices, limits, *, ceiling, runtime_kwargs=None, schedule=None, **gen_kwargs):
    """Admit rows one at a time whenever a slot is free (or at the steps in `schedule`); return ids per row."""
    engine = pipeline.open_refill(ceiling)
    got: dict[int, list[int]] = {}

    def done(i):
        def record(output, error):
            assert error is None, error
            got[i] = output.output_ids[0].tolist()

        return record

    pending = list(range(len(indices)))
    step = 0
    while pending or not engine.idle:
        while pending and engine.room and (schedule is None or schedule[pending[0]] <= step):
            i = pending.pop(0)
            row_kwargs = None if runtime_kwargs is None else {k: [v[i]] for k, v in runtime_kwargs.items()}
            pipeline.admit_refill(
                engine,
                [done(i)],
                messages=chats([indices[i]]),
                runtime_kwargs=row_kwargs,
                row_max_new_tokens=[limits[i]],
                max_new_tokens=max(limits),
                **gen_kwargs,
            )
        engine.step()
        step += 1
    return [got[i] for i in range(len(indices))], engine.stats


def test_unsteered_refill_is_token_identical_to_static_with_rows_ending_at_different_steps(make_pipeline):
    pipeline = make_pipeline()
    indices = list(range(6))
    reference = static_rows(pipeline, indices, LIMITS, do_sample=False)
    # a stop token that occurs inside one row's static output ends that row early too
    stop = reference[1][7]
    reference = static_rows(pipeline, indices, LIMITS, do_sample=False, stop_token_ids=[stop])
    rows, stats = refill_rows(pipeline, indices, LIMITS, ceiling=2, do_sample=False, stop_token_ids=[stop])
    assert rows == reference
    assert len({len(r) for r in rows}) >= 4  # rows really end at different steps
    assert stats.admitted == 6 and stats.prefills == 6
    assert stats.row_steps == sum(len(r) - 1 for r in rows)  # no step is spent on a finished row


@pytest.mark.parametrize("scale_position", ["exclude", "generation"])
def test_pasta_per_row_spans_refill_matches_static(make_pipeline, scale_position):
    pasta = PASTA(head_config=[0, 1], alpha=0.01, scale_position=scale_position)
    pipeline = make_pipeline([pasta])
    indices = list(range(6))
    kwargs = {"substrings": SUBSTRINGS}
    reference = static_rows(pipeline, indices, LIMITS, runtime_kwargs=kwargs, do_sample=False)
    rows, _ = refill_rows(pipeline, indices, LIMITS, ceiling=3, runtime_kwargs=kwargs, do_sample=False)
    assert rows == reference
    pasta.enabled = False
    unsteered = static_rows(pipeline, indices, LIMITS, do_sample=False)
    assert unsteered != reference  # the steering is visible, so the identity above is not vacuous


def test_caa_after_prompt_refill_matches_static(make_pipeline):
    caa = CAA(steering_vector=torch.randn(64, generator=torch.Generator().manual_seed(3)) * 4, layer_id=1, multiplier=2)
    pipeline = make_pipeline([caa])
    indices = list(range(6))
    reference = static_rows(pipeline, indices, LIMITS, do_sample=False)
    rows, _ = refill_rows(pipeline, indices, LIMITS, ceiling=2, do_sample=False)
    assert rows == reference
    caa.enabled = False
    assert static_rows(pipeline, indices, LIMITS, do_sample=False) != reference


def test_row_admitted_mid_flight_keeps_its_own_spans_and_ignores_the_others(make_pipeline):
    pipeline = make_pipeline([PASTA(head_config=[0, 1], alpha=0.01, scale_position="exclude")])
    indices = [1, 3, 4]
    limits = [30, 20, 15]
    kwargs = {"substrings": [["paris"], ["river"], ["city"]]}
    # row 2 joins after 6 decode steps of the others, into a batch whose cache is longer than its prompt
    rows, _ = refill_rows(
        pipeline, indices, limits, ceiling=3, runtime_kwargs=kwargs, schedule=[0, 0, 6], do_sample=False
    )
    alone = static_rows(pipeline, [4], [15], runtime_kwargs={"substrings": [["city"]]}, do_sample=False)
    assert rows[2] == alone[0]
    other_spans = static_rows(pipeline, [4], [15], runtime_kwargs={"substrings": [["paris"]]}, do_sample=False)
    assert other_spans[0] != alone[0]  # spans matter for this row, so it really used its own


def test_sampled_rows_use_their_own_item_seeds(make_pipeline):
    pipeline = make_pipeline()
    indices = [0, 1, 2, 3]
    limits = [10, 10, 10, 10]
    sampling = {"do_sample": True, "temperature": 1.3, "top_k": 50, "seed": 11}
    reference = static_rows(pipeline, indices, limits, seed_scope="item", **sampling)

    def admit_all(engine, into: dict) -> None:  # the four sampled requests; request i's tokens land in into[i]
        pipeline.admit_refill(
            engine,
            [lambda o, e, i=i: into.__setitem__(i, o.output_ids[0].tolist()) for i in range(4)],
            messages=chats(indices),
            max_new_tokens=10,
            **sampling,
        )

    engine = pipeline.open_refill(4)
    got = {}
    admit_all(engine, got)
    engine.drain()
    assert [got[i] for i in range(4)] == reference
    assert len({tuple(r) for r in reference}) > 1
    # the same request admitted into a busy engine draws the same tokens (its generator is its own)
    engine = pipeline.open_refill(5)
    late = {}
    pipeline.admit_refill(engine, [lambda o, e: None], messages=chats([5]), max_new_tokens=30, do_sample=True, seed=3)
    engine.step()
    admit_all(engine, late)
    engine.drain()
    assert [late[i] for i in range(4)] == reference


def test_refill_refuses_controls_that_do_not_declare_it(make_pipeline):
    actadd = ActAdd(steering_vector=torch.ones(64), layer_id=0)
    pipeline = make_pipeline([actadd])
    assert any("ActAdd" in b for b in pipeline.refill_blockers())
    with pytest.raises(ValueError, match="cannot refill"):
        pipeline.open_refill(2)
    engine = make_pipeline().open_refill(2)
    with pytest.raises(ValueError, match="n=1"):
        make_pipeline().admit_refill(engine, [None], messages=chats([0]), n=2, do_sample=True)


def test_live_logits_processors_block_refill(make_pipeline):
    from steer_hydra.core.controls import OutputControl

    class Suppress(OutputControl):
        supports_batching = True

        def get_logits_processors(self, input_ids, runtime_kwargs, **kwargs):
            return [lambda ids, scores: scores]

    pipeline = make_pipeline([Suppress()])
    assert pipeline.refill_blockers() == ["Suppress runs live logits processors or stopping criteria"]
