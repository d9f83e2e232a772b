"""GEPA (Agrawal et al. 2025, "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement Learning", arXiv
2507.19457) through the `gepa` package: the instruction evolves by reflection on rollouts and their scores, with a
Pareto frontier over validation rows.

How it runs (on the training rows only; `PromptOptimizer` has the shared steps): the training rows are split (seeded)
into GEPA's minibatch set and its validation set, both drawn from the training split, never from the evaluation.
`gepa.optimize` runs with an adapter whose `evaluate` rolls the task model out under a candidate instruction and
scores each response with the control's scorer, and whose reflective dataset shows the reflection model each input,
response and score (and the row's reference when it has one). The reflection model is the proposer: the pipeline's
own model by default, or an Inspect model (`InspectProposer`: a model name and/or an Inspect model role). The
budget is `max_metric_calls` scored rollouts; GEPA's state lives in the cache entry's work folder, so a killed run
resumes there. The chosen instruction is GEPA's best on its validation set.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from steer_hydra.controls.optimizers.base import Evaluator, PromptOptimizer

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'steer_hydra[optimize]' (gepa)"
COMPONENT = "instruction"


def import_gepa() -> Any:
    """The `gepa` module, or an ImportError naming the extra to install."""
    try:
        import gepa
    except ImportError as error:
        raise ImportError(f"GEPAPrompt needs the gepa package: {INSTALL_HINT}.") from error
    return gepa


class _Log:
    """GEPA's logger protocol onto this module's logger (GEPA otherwise prints)."""

    def log(self, message: str) -> None:
        logger.info("GEPA: %s", message)


class _Adapter:
    """GEPA's adapter: rows are training-row indices; a candidate is `{instruction: text}`."""

    propose_new_texts = None  # GEPA's own reflective proposer, with our reflection model

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    def evaluate(self, batch: Sequence[int], candidate: Mapping[str, str], capture_traces: bool = False) -> Any:
        from gepa import EvaluationBatch

        instruction = candidate[COMPONENT]
        indices = list(batch)
        outputs = self.evaluator.outputs(instruction, indices)
        scores = self.evaluator.scores(instruction, indices)
        traces = [{"row": i, "response": o, "score": s} for i, o, s in zip(indices, outputs, scores, strict=True)]
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=traces if capture_traces else None)

    def make_reflective_dataset(
        self, candidate: Mapping[str, str], eval_batch: Any, components_to_update: Sequence[str]
    ) -> dict[str, list[dict[str, Any]]]:
        records = []
        for trace in eval_batch.trajectories or []:
            row = self.evaluator.rows[trace["row"]]
            feedback = f"Score {trace['score']:.3f} (higher is better, 1 is best)."
            if row.get("reference"):
                feedback += f" A correct answer: {row['reference']}"
            records.append({"Inputs": row["input"], "Generated Outputs": trace["response"], "Feedback": feedback})
        return {name: records for name in components_to_update}


class GEPAPrompt(PromptOptimizer):
    """GEPA's reflective, Pareto-based evolution of the instruction (see the module docstring).

    Args (beyond `PromptOptimizer.Args`):
        max_metric_calls: the budget: scored rollouts over the whole run (the seed's validation pass included).
        minibatch_size: training rows per reflection step.
        val_fraction: the share of the training rows GEPA keeps as its validation set (at least one row).
        candidate_selection: GEPA's parent selection (`pareto`, `current_best`, `epsilon_greedy`).

    Batches and refills (one instruction for every row). All backends (optimized on the Hugging Face model).
    """

    OPTIMIZER = "gepa"

    @dataclass(frozen=True)
    class Args(PromptOptimizer.Args):
        max_metric_calls: int = 60
        minibatch_size: int = 3
        val_fraction: float = 0.5
        candidate_selection: str = "pareto"

        def validate(self) -> None:
            PromptOptimizer.Args.validate(self)
            if self.max_metric_calls < 1 or self.minibatch_size < 1 or not 0 < self.val_fraction < 1:
                raise ValueError(
                    "GEPAPrompt needs max_metric_calls >= 1, minibatch_size >= 1 and 0 < val_fraction < 1; got "
                    f"{self.max_metric_calls}, {self.minibatch_size}, {self.val_fraction}."
                )

    def library_versions(self) -> dict[str, str | None]:
        return {"gepa": version("gepa")}

    def optimize(self, evaluator: Evaluator, proposer: Callable[[str], str], work: Path, out: Path) -> dict[str, Any]:
        gepa = import_gepa()
        indices = list(range(len(evaluator.rows)))
        random.Random(self.seed).shuffle(indices)
        cut = min(len(indices) - 1, max(1, round(len(indices) * self.val_fraction))) if len(indices) > 1 else 1
        valset, trainset = indices[:cut], indices[cut:] or indices[:cut]
        result = gepa.optimize(
            seed_candidate={COMPONENT: self.initial},
            trainset=trainset,
            valset=valset,
            adapter=_Adapter(evaluator),
            reflection_lm=lambda prompt: str(proposer(prompt)),
            reflection_minibatch_size=min(self.minibatch_size, len(trainset)),
            candidate_selection_strategy=self.candidate_selection,
            max_metric_calls=self.max_metric_calls,
            run_dir=str(work / "gepa"),
            logger=_Log(),
            display_progress_bar=True,
            seed=self.seed,
            raise_on_exception=True,
        )
        candidates = [
            {"text": c[COMPONENT], "val_score": float(s), "parents": [p for p in parents if p is not None]}
            for c, s, parents in zip(result.candidates, result.val_aggregate_scores, result.parents, strict=True)
        ]
        chosen = result.candidates[result.best_idx][COMPONENT]
        return {
            "chosen": chosen,
            "candidates": candidates,
            "val_rows": len(valset),
            "minibatch_rows": len(trainset),
            "metric_calls": result.total_metric_calls,
            "train_score_chosen": evaluator.mean(chosen),
        }
