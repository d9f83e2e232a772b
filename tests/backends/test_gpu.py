"""On a CUDA GPU in bf16: PASTA alpha=1 is the identity, CAA adds `multiplier * v`, batch-vs-single agreement,
refill vs static agreement, and GPU memory back to its starting level after `release()` (skipped without CUDA)."""

from __future__ import annotations

import gc

import pytest
import torch

from steer_hydra.controls.state import CAA, PASTA
from steer_hydra.core import ModelSource, SteeringPipeline
from steer_hydra.models import TinySpec, build_tiny_model, save_tiny_model

pytestmark = pytest.mark.gpu

SPEC = TinySpec(hidden_size=512, num_hidden_layers=4, intermediate_size=1024)
PROMPTS = [
    "the cat and dog run to the city",
    "tell me a short story about a happy bird that can read",
    "where the river meets the sea",
    "please explain the sum of two numbers",
    "paris in france",
    "the sun is red and the sea is blue and the city is big",
    "a bird",
    "the capital of france is a city where the river runs",
]


def pipeline_on_cuda(controls=(), dtype=torch.bfloat16):
    model, tokenizer = build_tiny_model(SPEC)
    model = model.to(device="cuda", dtype=dtype)
    return SteeringPipeline(
        ModelSource(device="cuda"), model=model, tokenizer=tokenizer, controls=list(controls)
    ).steer()


def chats(prompts):
    return [[{"role": "user", "content": p}] for p in prompts]


def logits_of(pipeline, prompts):
    encoded = pipeline.tokenizer.apply_chat_template(
        chats(prompts), add_generation_prompt=True, padding=True, return_dict=True, return_tensors="pt"
    ).to("cuda")
    with torch.no_grad():
        return pipeline.model(**encoded).logits.float()


def test_pasta_alpha_one_is_the_identity_in_bf16():
    plain = pipeline_on_cuda()
    before = logits_of(plain, PROMPTS)
    plain.release()
    pasta = pipeline_on_cuda([PASTA(head_config=[0, 1, 2, 3], alpha=1.0, scale_position="exclude")])
    assert pasta.model.config._attn_implementation.startswith("steer_hydra_pasta_")
    assert torch.equal(logits_of(pasta, PROMPTS), before)
    steered = pasta.generate(
        messages=chats(PROMPTS),
        runtime_kwargs={"substrings": [["the"]] * len(PROMPTS)},
        max_new_tokens=8,
        do_sample=False,
        return_output=True,
    )
    unsteered_ids = [o.output_ids for o in steered]
    pasta.release()
    reference = pipeline_on_cuda().generate(
        messages=chats(PROMPTS), max_new_tokens=8, do_sample=False, return_output=True
    )
    assert all(torch.equal(a, b.output_ids) for a, b in zip(unsteered_ids, reference, strict=True))


def test_caa_adds_multiplier_times_vector_in_bf16():
    vector = torch.randn(SPEC.hidden_size, generator=torch.Generator().manual_seed(0))
    multiplier, layer = 3.0, 1
    captured = {}

    def next_layer_input(name):
        def hook(module, args, kwargs):
            captured[name] = (args[0] if args else kwargs["hidden_states"]).detach().float()

        return hook

    results = {}
    for name, controls in (
        ("plain", []),
        ("caa", [CAA(steering_vector=vector, layer_id=layer, multiplier=multiplier, token_scope="all")]),
    ):
        pipeline = pipeline_on_cuda(controls)
        handle = pipeline.model.model.layers[layer + 1].register_forward_pre_hook(
            next_layer_input(name), with_kwargs=True
        )
        pipeline.generate(messages=chats(PROMPTS[:2]), max_new_tokens=1, do_sample=False)
        handle.remove()
        results[name] = captured[name]
        pipeline.release()
    delta = results["caa"] - results["plain"]
    expected = (multiplier * vector).to(torch.bfloat16).float().cuda()
    scale = results["plain"].abs().max().item() + expected.abs().max().item()
    assert torch.allclose(delta, expected.expand_as(delta), atol=0.02 * scale, rtol=0)


def test_batch_versus_single_greedy_agreement_is_reported(capsys):
    pipeline = pipeline_on_cuda()
    batch = pipeline.generate(messages=chats(PROMPTS), max_new_tokens=16, do_sample=False, return_output=True)
    pad = pipeline.tokenizer.pad_token_id
    agree = 0
    for prompt, row in zip(PROMPTS, batch, strict=True):
        alone = pipeline.generate(messages=chats([prompt]), max_new_tokens=16, do_sample=False, return_output=True)[0]
        a = [t for t in row.output_ids[0].tolist() if t != pad]
        b = [t for t in alone.output_ids[0].tolist() if t != pad]
        agree += a == b
    pipeline.release()
    with capsys.disabled():
        print(f"\nbf16 batch-vs-single greedy agreement: {agree}/{len(PROMPTS)} rows identical over 16 tokens")
    assert 0 <= agree <= len(PROMPTS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_refill_versus_static_greedy_agreement(dtype, capsys):
    pipeline = pipeline_on_cuda([PASTA(head_config=[1], alpha=0.01, scale_position="exclude")], dtype=dtype)
    substrings = [[p.split()[1]] for p in PROMPTS]
    limits = [4, 16, 9, 12, 2, 16, 7, 11]
    static = pipeline.generate(
        messages=chats(PROMPTS),
        runtime_kwargs={"substrings": substrings},
        max_new_tokens=16,
        do_sample=False,
        return_output=True,
    )
    engine = pipeline.open_refill(3)
    got = {}
    pending = list(range(len(PROMPTS)))
    while pending or not engine.idle:
        while pending and engine.room:
            i = pending.pop(0)
            pipeline.admit_refill(
                engine,
                [lambda o, e, i=i: got.__setitem__(i, o.output_ids[0].tolist())],
                messages=chats([PROMPTS[i]]),
                runtime_kwargs={"substrings": [substrings[i]]},
                row_max_new_tokens=[limits[i]],
                max_new_tokens=16,
                do_sample=False,
            )
        engine.step()
    agree = sum(got[i] == static[i].output_ids[0].tolist()[: limits[i]] for i in range(len(PROMPTS)))
    pipeline.release()
    with capsys.disabled():
        print(f"\n{dtype} refill-vs-static greedy agreement (PASTA, ceiling 3): {agree}/{len(PROMPTS)} rows")
    if dtype == torch.float32:
        assert agree == len(PROMPTS)


def test_release_returns_gpu_memory_to_its_starting_level(tmp_path):
    checkpoint = save_tiny_model(tmp_path / "model", SPEC)
    gc.collect()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    pipeline = SteeringPipeline(
        ModelSource(str(checkpoint), device="cuda", hf_model_kwargs={"dtype": torch.bfloat16}),
        controls=[CAA(steering_vector=torch.randn(SPEC.hidden_size), layer_id=1, multiplier=2.0)],
    ).steer()
    pipeline.generate(messages=chats(PROMPTS), max_new_tokens=8, do_sample=False)
    loaded = torch.cuda.memory_allocated()
    pipeline.release()
    gc.collect()
    torch.cuda.empty_cache()
    assert loaded - start > 10 * 2**20  # the model really was on the GPU
    assert torch.cuda.memory_allocated() - start < 2**20
