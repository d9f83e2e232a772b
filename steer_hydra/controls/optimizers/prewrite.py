"""PRewrite (Kong et al. 2024, "PRewrite: Prompt Rewriting with Reinforcement Learning", arXiv 2401.08189): a
rewriter model, fine-tuned with reinforcement learning on the task reward, rewrites the initial instruction.

How it runs (on the training rows only; `PromptOptimizer` has the shared steps):
1. The rewriter is a LoRA on a copy of the pipeline's model, prompted with the paper's rewrite meta-prompt
   ("Rewrite the following instruction via rephrasing and/or adding specific requirements...").
2. Reinforcement learning (`rl_steps` > 0): each step samples `num_generations` rewrites of the initial instruction
   and rewards each with the mean score of the task model's responses under it on `reward_rows` training rows
   drawn for that step; the rewriter is updated with TRL's GRPO (group-normalized advantages: PPO's clipped
   objective without a value network; the paper used PPO). The task model itself is never updated.
3. Inference: `sample` draws `num_rewrites` rewrites from the (trained) rewriter and keeps the one with the best
   training score, the initial instruction included (the paper's PRewrite-S); `greedy` takes one greedy rewrite
   (PRewrite-I), kept only if it beats the initial on the training rows.

A proposer other than the pipeline's own model (an Inspect model, a callable) cannot be fine-tuned: then
`rl_steps` must be 0 and PRewrite is the sampled rewrite search of step 3 alone.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import torch

from steer_hydra.controls.optimizers.base import (
    Evaluator,
    PromptOptimizer,
    best_candidate,
    clean_instruction,
    generate_texts,
)

logger = logging.getLogger(__name__)

REWRITE_PROMPT = (
    "Rewrite the following instruction via rephrasing and/or adding specific requirements. Add instructions which "
    "would be helpful to solve the problem correctly. Output the new instruction only.\n\nInstruction: {instruction}"
)


class PRewrite(PromptOptimizer):
    """An RL-trained rewriter of the initial instruction (see the module docstring).

    Args (beyond `PromptOptimizer.Args`: `initial`, `data`, `scorer`, `split`, `target`, `proposer`, ...):
        meta_prompt: the rewrite prompt; `{instruction}` is replaced by the instruction.
        rl_steps: GRPO steps on the rewriter (0: no training, only the sampled search).
        num_generations: rewrites per RL step (the group GRPO normalizes over).
        reward_rows: training rows scored per rewrite in an RL step.
        learning_rate, lora_r: the rewriter's LoRA training.
        inference: `sample` (best of `num_rewrites` rewrites, PRewrite-S) or `greedy` (PRewrite-I).
        num_rewrites: rewrites drawn at inference with `sample`.

    Batches and refills (one instruction for every row). All backends (optimized on the Hugging Face model).
    """

    OPTIMIZER = "prewrite"

    @dataclass(frozen=True)
    class Args(PromptOptimizer.Args):
        meta_prompt: str = REWRITE_PROMPT
        rl_steps: int = 16
        num_generations: int = 4
        reward_rows: int = 4
        learning_rate: float = 1e-4
        lora_r: int = 8
        inference: Literal["sample", "greedy"] = "sample"
        num_rewrites: int = 4

        def validate(self) -> None:
            PromptOptimizer.Args.validate(self)
            if "{instruction}" not in self.meta_prompt:
                raise ValueError("PRewrite.meta_prompt must contain {instruction}. Fix: keep the placeholder.")
            if self.rl_steps < 0 or self.num_generations < 2 or self.reward_rows < 1 or self.num_rewrites < 1:
                raise ValueError(
                    "PRewrite needs rl_steps >= 0, num_generations >= 2 (GRPO compares a group), reward_rows >= 1 "
                    f"and num_rewrites >= 1; got {self.rl_steps}, {self.num_generations}, {self.reward_rows}, "
                    f"{self.num_rewrites}."
                )
            if self.rl_steps and self.proposer is not None:
                raise ValueError(
                    "PRewrite fine-tunes its rewriter, which must be the pipeline's own model (proposer=None); an "
                    "Inspect model or a callable cannot be trained. Fix: proposer=null, or rl_steps=0 (search only)."
                )

    def library_versions(self) -> dict[str, str | None]:
        return {"trl": version("trl") if self.rl_steps else None}

    def _rewrite_chat(self, tokenizer: Any) -> list[dict[str, str]] | str:
        text = self.meta_prompt.replace("{instruction}", self.initial)
        return [{"role": "user", "content": text}] if getattr(tokenizer, "chat_template", None) else text

    def _train_rewriter(self, evaluator: Evaluator, work: Path) -> torch.nn.Module:
        """A LoRA rewriter on a copy of the model, trained with GRPO on the training reward."""
        from datasets import Dataset
        from peft import LoraConfig

        from steer_hydra.controls.structural.train import import_trl

        trl = import_trl()
        tokenizer = copy.deepcopy(evaluator.tokenizer)
        rng = random.Random(self.seed)
        rows = len(evaluator.rows)

        def reward(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
            picked = rng.sample(range(rows), min(self.reward_rows, rows))
            out = []
            for completion in completions:
                text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
                instruction = clean_instruction(text)
                out.append(evaluator.mean(instruction, picked) if instruction else 0.0)
            return out

        dataset = Dataset.from_list([{"prompt": self._rewrite_chat(tokenizer)}] * (self.rl_steps * 2))
        config = trl.GRPOConfig(
            output_dir=str(work / "rewriter"),
            max_steps=self.rl_steps,
            per_device_train_batch_size=self.num_generations,
            num_generations=self.num_generations,
            max_completion_length=self.proposal_tokens,
            learning_rate=self.learning_rate,
            temperature=1.0,
            seed=self.seed,
            bf16=next(evaluator.model.parameters()).dtype == torch.bfloat16,
            fp16=False,
            gradient_checkpointing=False,
            save_strategy="no",
            logging_steps=max(1, self.rl_steps // 4),
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            disable_tqdm=False,
            dataloader_num_workers=0,
        )
        rewriter = copy.deepcopy(evaluator.model)
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            trainer = trl.GRPOTrainer(
                model=rewriter,
                reward_funcs=reward,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                peft_config=LoraConfig(r=self.lora_r, lora_alpha=2 * self.lora_r, target_modules="all-linear"),
            )
            trainer.train()
        model = trainer.model
        model.eval()
        return model

    def optimize(self, evaluator: Evaluator, proposer: Callable[[str], str], work: Path, out: Path) -> dict[str, Any]:
        rewriter: Any = None
        if self.rl_steps:
            logger.info("PRewrite: training the rewriter with GRPO for %d steps", self.rl_steps)
            rewriter = self._train_rewriter(evaluator, work)
        texts: list[str] = []
        count = 1 if self.inference == "greedy" else self.num_rewrites
        if rewriter is not None:
            for i in range(count):
                (text,) = generate_texts(
                    rewriter,
                    evaluator.tokenizer,
                    [self._rewrite_chat(evaluator.tokenizer)],
                    max_new_tokens=self.proposal_tokens,
                    batch_size=1,
                    sample=self.inference == "sample",
                    seed=self.seed * 1000 + i,
                )
                texts.append(clean_instruction(text))
            del rewriter
        else:
            prompt = self.meta_prompt.replace("{instruction}", self.initial)
            texts = [self.propose(proposer, prompt) or "" for _ in range(count)]
        candidates = [{"text": self.initial, "train_score": evaluator.mean(self.initial), "source": "initial"}]
        for text in dict.fromkeys(t for t in texts if t and t != self.initial):
            candidates.append({"text": text, "train_score": evaluator.mean(text), "source": "rewrite"})
        best = best_candidate(candidates)
        return {
            "chosen": best["text"],
            "train_score_chosen": best["train_score"],
            "candidates": candidates,
            "rl_steps": self.rl_steps,
        }
