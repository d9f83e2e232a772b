"""LoRAAdapter on the vLLM backends: per-request LoRA on a real offline engine (agreement with the Hugging Face merged
adapter, base requests in the same engine unsteered, a mixed batch), and vllm_serve's adapter routing and refusal
against the loopback server (no vLLM needed for those)."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.backends.vllm.serve import VLLMServeBackend
from steer_hydra.controls.structural import LoRAAdapter
from steer_hydra.core import BackendSpec, SteeringPipeline
from steer_hydra.models import TinySpec, build_tiny_model

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
TINY64_SPEC = TinySpec(hidden_size=256, num_attention_heads=4, head_dim=64, intermediate_size=512)  # vllm_real.TINY64


def save_adapter(folder, spec: TinySpec = TinySpec(), seed: int = 0) -> str:
    """A random rank-4 LoRA on q_proj and v_proj of a tiny model (nothing trained), saved to `folder`."""
    from peft import LoraConfig, get_peft_model

    model, _ = build_tiny_model(spec)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(folder))
    return str(folder)


# ---------------------------------------------------------------------- vllm_serve (loopback server)
def _serve(server, adapter: str, **kwargs) -> SteeringPipeline:
    _, tokenizer = build_tiny_model()
    return SteeringPipeline(
        "tiny",
        controls=[LoRAAdapter(adapter=adapter, **kwargs)],
        backend=BackendSpec("vllm_serve", {"base_url": server.base_url, "max_retries": 0}),
        tokenizer=tokenizer,
    )


def test_serve_refuses_an_adapter_the_server_does_not_list_naming_the_command_line(loopback, tmp_path):
    adapter = save_adapter(tmp_path / "adapter")
    control_name = LoRAAdapter(adapter=adapter).adapter_name
    pipeline = _serve(loopback, adapter)
    with pytest.raises(ValueError, match="does not serve the LoRA adapter") as info:
        pipeline.steer()
    message = str(info.value)
    assert (
        f"--enable-lora --max-lora-rank 8 --max-loras 2 --lora-modules {control_name}={tmp_path / 'adapter'}" in message
    )
    assert "launch_args=[--enable-lora" in message and "['tiny']" in message
    assert not pipeline.is_steered


def test_serve_names_the_adapter_as_each_requests_model_while_enabled(loopback, tmp_path, monkeypatch):
    adapter = save_adapter(tmp_path / "adapter")
    listed = []

    def with_adapter(self, method, path, body=None, **kwargs):  # vLLM lists served adapters beside their base
        payload = original(self, method, path, body, **kwargs)
        if path == "/v1/models":
            payload = {**payload, "data": [*payload["data"], {"id": "mine", "parent": "tiny", "root": adapter}]}
            listed.append(payload)
        return payload

    original = VLLMServeBackend._request
    monkeypatch.setattr(VLLMServeBackend, "_request", with_adapter)
    pipeline = _serve(loopback, adapter, name="mine").steer()
    try:
        assert pipeline.backend_identity()["served_model"] == "tiny"  # the adapter entry is not the base model
        loopback.reset()
        pipeline.generate(text=["hello", "a"], max_new_tokens=3)
        (control,) = pipeline.controls
        control.enabled = False
        pipeline.generate(text=["hello"], max_new_tokens=3)
        models = [r.body["model"] for r in loopback.completion_requests()]
        assert models == ["mine", "mine", "tiny"] and listed
    finally:
        pipeline.release()


# ---------------------------------------------------------------------- vllm (a real offline engine)
@pytest.fixture(scope="module")
def tiny64_adapter(tmp_path_factory) -> str:
    return save_adapter(tmp_path_factory.mktemp("lora64") / "adapter", TINY64_SPEC)


@pytest.fixture(scope="module")
def lora_engine(tiny64_adapter):
    from vllm_real import ENGINE_OPTIONS, TINY64, steered

    with steered(TINY64, [LoRAAdapter(adapter=tiny64_adapter)], BackendSpec("vllm", ENGINE_OPTIONS)) as pipeline:
        yield pipeline


def _hf_rows(adapter: str | None) -> list[list[int]]:
    from vllm_real import TINY64, generate, rows, steered

    controls = [LoRAAdapter(adapter=adapter, merge=True)] if adapter else []
    with steered(TINY64, controls) as pipeline:
        return rows(pipeline, generate(pipeline))


@pytest.mark.vllm
def test_engine_serves_the_adapter_per_request_like_hugging_face_merged(lora_engine, tiny64_adapter, record_property):
    from vllm_real import MIN_AGREEMENT, agreement, generate, rows

    backend = lora_engine._backend
    assert (backend.options["enable_lora"], backend.options["max_lora_rank"], backend.options["max_loras"]) == (
        True,
        8,
        2,
    )
    (control,) = lora_engine.controls
    control.enabled = True
    adapted = rows(lora_engine, generate(lora_engine))
    expected = _hf_rows(tiny64_adapter)
    assert agreement("offline lora", expected, adapted, record_property) >= MIN_AGREEMENT
    control.enabled = False  # a base request in the same engine
    try:
        base = rows(lora_engine, generate(lora_engine))
    finally:
        control.enabled = True
    assert agreement("offline lora engine, base rows", _hf_rows(None), base, record_property) >= MIN_AGREEMENT
    assert sum(a != b for a, b in zip(adapted, base, strict=True)) >= len(base) // 2  # the adapter really acts


@pytest.mark.vllm
def test_a_batch_mixing_adapter_and_base_requests_gives_each_row_what_it_gets_alone(lora_engine):
    from vllm_real import chat_prompts

    from steer_hydra.backends.vllm.lowering import sampling_fields
    from steer_hydra.core import GenerationParams

    backend = lora_engine._backend
    prompts = chat_prompts(lora_engine.tokenizer)
    lora = backend._lora_fields(backend._lora)
    params = GenerationParams.from_kwargs(max_new_tokens=12)
    fields = [sampling_fields(params) | (lora if i % 2 == 0 else {}) for i in range(len(prompts))]
    mixed = [c[0] for c in backend._complete(prompts, fields)]  # one engine call: the rows batch together
    alone = [backend._complete([p], [f])[0][0] for p, f in zip(prompts, fields, strict=True)]
    assert mixed == alone
    assert mixed[0] != backend._complete([prompts[0]], [sampling_fields(params)])[0][0]


@pytest.mark.vllm
def test_a_launched_server_with_the_adapter_serves_it_like_hugging_face(tiny64_adapter, tmp_path, record_property):
    from vllm_real import MIN_AGREEMENT, TINY64, agreement, generate, rows, steered

    from steer_hydra.backends.vllm.launch import launch_server

    name = LoRAAdapter(adapter=tiny64_adapter).adapter_name
    lora_args = [
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--max-loras",
        "2",
        "--lora-modules",
        f"{name}={tiny64_adapter}",
    ]
    options = {"launch": True, "launch_timeout": 300, "launch_args": [*lora_args, "--max-model-len", "512"]}
    config = {
        "model": {"model_name_or_path": TINY64, "hf_model_kwargs": {"dtype": "float32"}},
        "backend": {"options": options},
    }
    server = launch_server(config, tmp_path)
    try:
        spec = BackendSpec("vllm_serve", {"base_url": server.base_url})
        with steered(TINY64, [LoRAAdapter(adapter=tiny64_adapter)], spec) as pipeline:
            assert pipeline.backend_identity()["served_model"] == TINY64  # the adapter's entry is not the base
            adapted = rows(pipeline, generate(pipeline))
        with steered(TINY64, [], spec) as pipeline:
            base = rows(pipeline, generate(pipeline))
    finally:
        server.stop()
    assert agreement("served lora", _hf_rows(tiny64_adapter), adapted, record_property) >= MIN_AGREEMENT
    assert agreement("served lora server, base rows", _hf_rows(None), base, record_property) >= MIN_AGREEMENT
    assert sum(a != b for a, b in zip(adapted, base, strict=True)) >= len(base) // 2
