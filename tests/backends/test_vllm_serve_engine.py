"""backend=vllm_serve against a real vLLM OpenAI server on 127.0.0.1 that this module starts and stops.

The server runs with the steering plugin switched on (`STEER_HYDRA_VLLM_STEERING=1`, eager mode), so CAA and
ActAdd travel per request (`vllm_xargs`, `cache_salt`) and concurrent steered and unsteered requests batch
together on the server. The loopback server (test_vllm_serve.py) stays for fault injection.
"""

from __future__ import annotations

import pytest
from vllm_real import (
    MIN_AGREEMENT,
    TINY64,
    agreement,
    chat_prompts,
    generate,
    rows,
    run_eval,
    steered,
    steering_controls,
    vllm_server,
)

from steer_hydra.backends.vllm.lowering import sampling_fields
from steer_hydra.backends.vllm.steering import ENV_FLAG, lower, steering_fields
from steer_hydra.controls.state import ActAdd
from steer_hydra.core import BackendSpec, GenerationParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
SERVED_NAME = "tiny64"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`vllm serve` of the tiny model with the steering plugin on; yields its base URL; stopped at module end."""
    log = tmp_path_factory.mktemp("vllm_serve") / "server.log"
    with vllm_server(TINY64, ["--served-model-name", SERVED_NAME], log, env={ENV_FLAG: "1"}) as (base_url, process):
        yield base_url
    assert process.returncode is not None


@pytest.fixture(scope="module")
def client(server):
    spec = BackendSpec("vllm_serve", {"base_url": server, "max_concurrency": 8})
    with steered(TINY64, steering_controls(), spec) as pipeline:
        assert pipeline._backend.served_model == SERVED_NAME  # discovered from /v1/models
        yield pipeline


@pytest.mark.parametrize(
    "active", [(), ("CAA",), ("ActAdd",), ("DirectionalAblation",)], ids=["plain", "caa", "actadd", "ablation"]
)
def test_greedy_outputs_agree_with_hugging_face_unsteered_and_steered(tiny64_hf, client, active, record_property):
    expected, served = generate(tiny64_hf, active), generate(client, active)
    name = "+".join(active) or "unsteered"
    assert agreement(f"serve {name}", rows(tiny64_hf, expected), rows(client, served), record_property) >= MIN_AGREEMENT
    assert [o.finish_reasons for o in served] == [o.finish_reasons for o in expected]


def test_concurrent_steered_and_unsteered_requests_do_not_leak_into_each_other(tiny64_hf, client):
    backend, tokenizer = client._backend, client.tokenizer
    prompts = chat_prompts(tokenizer)
    actadd = next(c for c in client.state_controls if isinstance(c, ActAdd))
    (addition,) = lower(actadd)
    params = GenerationParams.from_kwargs(max_new_tokens=16)
    fields = [
        sampling_fields(params) | (steering_fields([addition], len(p)) if i % 2 else {}) for i, p in enumerate(prompts)
    ]
    mixed = [c[0] for c in backend._complete(prompts, fields)]  # 8 requests in flight at once
    alone = [backend._complete([p], [f])[0][0] for p, f in zip(prompts, fields, strict=True)]
    assert mixed == alone
    steered_hf, plain_hf = rows(tiny64_hf, generate(tiny64_hf, ("ActAdd",))), rows(tiny64_hf, generate(tiny64_hf))
    expected = [steered_hf[i] if i % 2 else plain_hf[i] for i in range(len(prompts))]
    assert agreement("serve mixed batch", expected, mixed) >= MIN_AGREEMENT


def test_seeds_n_and_stop_strings_on_the_server(tiny64_hf, client):
    first = generate(client, do_sample=True, n=2, seed=11, max_new_tokens=8)
    assert rows(client, first) == rows(client, generate(client, do_sample=True, n=2, seed=11, max_new_tokens=8))
    assert rows(client, first) != rows(client, generate(client, do_sample=True, n=2, seed=12, max_new_tokens=8))
    text = tiny64_hf.tokenizer.decode(generate(tiny64_hf)[1].output_ids[0, 2:4])
    expected, served = generate(tiny64_hf, stop_strings=[text]), generate(client, stop_strings=[text])
    assert rows(client, served) == rows(tiny64_hf, expected) and served[1].finish_reasons == ["stop"]


def test_an_inspect_eval_through_the_provider_scores_like_hugging_face(tiny64_hf, client, tmp_path, record_property):
    for pipeline in (tiny64_hf, client):
        for control in pipeline.state_controls:
            control.enabled = isinstance(control, ActAdd)
    expected, served = run_eval(tiny64_hf, tmp_path, "hf"), run_eval(client, tmp_path, "serve")
    same = [expected[k][0] == served[k][0] for k in expected]
    print(f"[vllm agreement] serve Inspect eval ActAdd: {sum(same)}/{len(same)} completions identical")
    record_property("inspect_serve_actadd", f"{sum(same)}/{len(same)}")
    assert sum(same) / len(same) >= MIN_AGREEMENT
    assert all(expected[k][1] == served[k][1] for k in expected if expected[k][0] == served[k][0])
