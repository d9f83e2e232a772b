"""Cost and effect of the trained and optimized controls on a real model, measured in one run.

    .venv/bin/python benchmarks/trained_controls.py train      # SFT and DPO LoRA per concept: seconds, steps, loss
    .venv/bin/python benchmarks/trained_controls.py optimize   # prompt optimizers on arithmetic: train vs held out
    .venv/bin/python benchmarks/trained_controls.py train --concepts weddings joy french --model steer_hydra:smollm2

`train` fits the study's `sft_concept` and `dpo_concept` settings (LoRA rank 8 on every projection, 3 epochs, rate
5e-4, batch 4) on each concept's contrastive pairs and prints the wall time of the training (a fresh cache), then
the time of the same steer from the cache (what every later job of a study pays).

`optimize` runs each prompt optimizer on the first `--train` problems of the built-in arithmetic task (scored with
the task's own `number_match` scorer through `sample_scorer_from_inspect`) and evaluates on the next `--held-out`
problems (never shown to the optimizer): the unsteered model, the initial instruction as a system prompt, and the chosen
instruction, greedy; deltas are paired by problem with a 95% percentile bootstrap interval (5000 resamples).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _pipeline(model: str, controls: list) -> Any:
    from steer_hydra.core import SteeringPipeline

    return SteeringPipeline(model, controls=controls).steer()


def train(args: argparse.Namespace) -> None:
    from steer_hydra.controls.structural import DPOAdapter, SFTAdapter
    from steer_hydra.tasks.concepts import concept_pairs

    settings = {"lora_r": 8, "lora_alpha": 16, "epochs": 3.0, "learning_rate": 5e-4, "batch_size": 4, "seed": 0}
    print(f"{'concept':<10} {'trainer':<6} {'pairs':>5} {'steps':>5} {'train s':>8} {'loss':>7} {'cached s':>8}")
    for concept in args.concepts:
        pairs = concept_pairs(concept)
        for cls in (SFTAdapter, DPOAdapter):
            control = cls(data=pairs, cache_dir=args.cache, **settings)
            start = time.perf_counter()
            pipeline = _pipeline(args.model, [control])
            trained = time.perf_counter() - start
            record = control.training_record or {}
            pipeline.release()
            again = cls(data=pairs, cache_dir=args.cache, **settings)
            start = time.perf_counter()
            _pipeline(args.model, [again]).release()
            cached = time.perf_counter() - start
            assert again.trained_steps == 0
            print(
                f"{concept:<10} {cls.TRAINER:<6} {len(pairs):>5} {control.trained_steps:>5} {trained:>8.1f} "
                f"{record.get('train_loss', float('nan')):>7.3f} {cached:>8.1f}",
                flush=True,
            )


def _bootstrap(deltas: np.ndarray, rng: np.random.Generator, resamples: int = 5000) -> tuple[float, float]:
    means = deltas[rng.integers(0, len(deltas), size=(resamples, len(deltas)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def optimize(args: argparse.Namespace) -> None:
    from steer_hydra.controls.input import SystemPrompt
    from steer_hydra.controls.optimizers import CPO, GEPAPrompt, PRewrite
    from steer_hydra.evaluation.scorers import sample_scorer_from_inspect
    from steer_hydra.tasks.arithmetic import arithmetic_samples, number_match

    samples = arithmetic_samples()
    rows = [{"input": s.input, "reference": s.target, "id": s.id} for s in samples]
    train_rows, held_out = rows[: args.train], rows[args.train : args.train + args.held_out]
    scorer = sample_scorer_from_inspect(number_match())
    initial = "Answer the question."
    common = {
        "initial": initial,
        "data": train_rows,
        "scorer": scorer,
        "max_new_tokens": args.tokens,
        "batch_size": 12,
        "cache_dir": args.cache,
        "seed": 0,
    }
    optimizers: dict[str, Callable[[], Any]] = {
        "cpo": lambda: CPO(
            **common,
            candidates=["Give only the final number.", "Compute step by step, then state the number."],
            num_rewrites=args.rewrites,
            assignments=2,
        ),
        "prewrite": lambda: PRewrite(**common, rl_steps=args.rl_steps, num_rewrites=4),
        "gepa": lambda: GEPAPrompt(**common, max_metric_calls=args.gepa_calls, minibatch_size=3),
    }

    def held_out_scores(controls: list) -> np.ndarray:
        pipeline = _pipeline(args.model, controls)
        chats = [[{"role": "user", "content": r["input"]}] for r in held_out]
        out = []
        for i in range(0, len(chats), 12):
            out += pipeline.generate(messages=chats[i : i + 12], max_new_tokens=args.tokens, do_sample=False)
        pipeline.release()
        return np.array([scorer(text, row) for text, row in zip(out, held_out, strict=True)])

    rng = np.random.default_rng(0)
    unsteered = held_out_scores([])
    with_initial = held_out_scores([SystemPrompt(text=initial)])
    print(
        f"arithmetic: {len(train_rows)} training problems, {len(held_out)} held out; held-out mean unsteered "
        f"{unsteered.mean():.3f}, initial instruction {with_initial.mean():.3f}"
    )
    for name in args.optimizers:
        control = optimizers[name]()
        start = time.perf_counter()
        pipeline = _pipeline(args.model, [control])
        seconds = time.perf_counter() - start
        pipeline.release()
        record = control.optimization
        chosen = held_out_scores([optimizers[name]()])  # a fresh control: the choice comes from the cache
        delta = chosen - with_initial
        low, high = _bootstrap(delta, rng)
        print(
            f"{name}: {seconds:.0f} s, {record['rollouts']} rollouts; chosen {record['chosen']!r}\n"
            f"  train {record['train_score_initial']:.3f} -> {record['train_score_chosen']:.3f}"
            + (f" (per-query policy {record['train_score_policy']:.3f})" if "train_score_policy" in record else "")
            + f"; held out {with_initial.mean():.3f} -> {chosen.mean():.3f}, delta {delta.mean():+.3f} "
            f"[{low:+.3f}, {high:+.3f}]",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["train", "optimize"])
    parser.add_argument("--model", default="steer_hydra:smollm2")
    parser.add_argument("--concepts", nargs="+", default=["weddings", "joy", "french"])
    parser.add_argument("--optimizers", nargs="+", default=["cpo", "prewrite", "gepa"])
    parser.add_argument("--train", type=int, default=20, help="training problems (the first ones)")
    parser.add_argument("--held-out", type=int, default=40, help="held-out problems (the ones after the training ones)")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per answer (rollouts and evaluation)")
    parser.add_argument("--rewrites", type=int, default=2, help="CPO's proposals from the model beside its pool")
    parser.add_argument("--rl-steps", type=int, default=4)
    parser.add_argument("--gepa-calls", type=int, default=60)
    parser.add_argument("--cache", default=None, help="artifact cache (default: a fresh temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as fresh:
        args.cache = args.cache or fresh
        train(args) if args.what == "train" else optimize(args)


if __name__ == "__main__":
    main()
