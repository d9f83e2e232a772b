"""CPO, causal prompt optimization (Chen et al. 2026, "Optimizing Prompts for Large Language Models: A Causal
Approach", arXiv 2602.01711): pick, per query, the instruction whose estimated causal effect on the reward is the
largest, with the effect model fitted by double machine learning.

How it runs (on the training rows only; `PromptOptimizer` has the shared steps):
1. The pool: `initial`, the given `candidates` and `num_rewrites` proposals (the proposer rewriting `initial`).
2. Data: every training query is answered under `assignments` pool members drawn at random (seeded), and each
   response scored: `(query, instruction, reward)` triples.
3. Embeddings: a text is the mean of the base model's input-token embeddings over its tokens, projected by PCA to
   `dims` dimensions (queries and instructions separately). No forward pass is needed, so the policy runs on any
   backend from the tokenizer alone.
4. Double machine learning (cross-fitted over `folds`): ridge nuisance models predict the reward from the query,
   `m(x)`, and the instruction embedding from the query, `e(x)`; the effect model is a ridge fit of the residual
   reward on the residual instruction times the query, `Y - m(x) ~ (t - e(x))' (A x + b)`, so the estimated effect
   of instruction `t` on query `x` is `tau(x, t) = t' (A x + b)` (up to terms that do not depend on `t`).
5. The policy: `argmax_t tau(x, t)` per query (`per_query: true`, the paper's instance-adaptive selection); with
   `per_query: false`, the instruction with the largest mean effect over the training queries, for every query.

Recorded: the pool with each member's observed mean reward and mean estimated effect, the fixed choice and its
training score, and the policy's training score; the policy's arrays are in the entry's `policy.npz`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from steer_hydra.controls.optimizers.base import Evaluator, PromptOptimizer
from steer_hydra.core.identity import canonical_json

logger = logging.getLogger(__name__)

PROPOSE_PROMPT = (
    "Write a different instruction for an assistant with the same goal as this one, in one or two sentences. "
    "Output the new instruction only.\n\nInstruction: {instruction}"
)


def ridge(features: np.ndarray, targets: np.ndarray, alpha: float) -> np.ndarray:
    """Ridge regression weights (with an unpenalized intercept as the last row): `[features, 1] @ W ~ targets`."""
    design = np.hstack([features, np.ones((features.shape[0], 1))])
    penalty = alpha * np.eye(design.shape[1])
    penalty[-1, -1] = 0.0
    return np.linalg.solve(design.T @ design + penalty, design.T @ targets)


def _predict(weights: np.ndarray, features: np.ndarray) -> np.ndarray:
    return np.hstack([features, np.ones((features.shape[0], 1))]) @ weights


def fit_effect(
    x: np.ndarray, t: np.ndarray, y: np.ndarray, *, folds: int, alpha: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`(A, b)` of the effect model `tau(x, t) = t' (A x + b)`, fitted by cross-fitted double machine learning.

    `x`: `[n, dx]` query features, `t`: `[n, dt]` instruction features, `y`: `[n]` rewards.
    """
    n = len(y)
    order = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(order, max(2, min(folds, n)))
    y_res, t_res = np.zeros(n), np.zeros_like(t)
    for held in parts:
        train = np.setdiff1d(order, held)
        y_res[held] = y[held] - _predict(ridge(x[train], y[train], alpha), x[held])
        t_res[held] = t[held] - _predict(ridge(x[train], t[train], alpha), x[held])
    x1 = np.hstack([x, np.ones((n, 1))])
    z = np.einsum("ni,nj->nij", t_res, x1).reshape(n, -1)  # residual instruction times [x, 1]
    theta = np.linalg.solve(z.T @ z + alpha * np.eye(z.shape[1]), z.T @ y_res)
    theta = theta.reshape(t.shape[1], x1.shape[1])
    return theta[:, :-1], theta[:, -1]


@dataclass
class CPOPolicy:
    """The fitted per-query policy: token embeddings projected for queries, the pool's projected embeddings, the
    effect model."""

    pool: list[str]
    query_table: np.ndarray  # [vocab, dx]: each token's input embedding, projected (queries)
    query_center: np.ndarray  # [dx]
    pool_features: np.ndarray  # [K, dt]
    a: np.ndarray  # [dt, dx]
    b: np.ndarray  # [dt]

    def query_features(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = [i for i in token_ids if 0 <= i < len(self.query_table)] or [0]
        return self.query_table[ids].mean(axis=0) - self.query_center

    def effects(self, token_ids: Sequence[int]) -> np.ndarray:
        """`tau(x, t_k)` for every pool member."""
        x = self.query_features(token_ids)
        return self.pool_features @ (self.a @ x + self.b)

    def choose(self, token_ids: Sequence[int]) -> int:
        return int(np.argmax(self.effects(token_ids)))

    def save(self, path: Path) -> None:
        np.savez(
            path,
            query_table=self.query_table,
            query_center=self.query_center,
            pool_features=self.pool_features,
            a=self.a,
            b=self.b,
        )

    @classmethod
    def load(cls, path: Path, pool: list[str]) -> CPOPolicy:
        with np.load(path) as data:
            return cls(pool, *(np.asarray(data[k]) for k in ("query_table", "query_center", "pool_features", "a", "b")))


def _pca(matrix: np.ndarray, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """`(center, projection [features, dims])` of the top principal directions of the rows of `matrix`."""
    center = matrix.mean(axis=0)
    _, _, vt = np.linalg.svd(matrix - center, full_matrices=False)
    return center, vt[: max(1, min(dims, vt.shape[0]))].T


class CPO(PromptOptimizer):
    """Causal prompt optimization: a per-query choice among a pool of instructions, by a DML-fitted effect model.

    Args (beyond `PromptOptimizer.Args`):
        candidates: pool members beside `initial`.
        num_rewrites: proposals added to the pool (the proposer rewriting `initial`).
        assignments: pool members tried per training query.
        dims: PCA dimensions of the query and instruction embeddings.
        ridge: the ridge penalty of every regression.
        folds: cross-fitting folds.
        per_query: choose per query (the paper) or one instruction for all.

    Batches and refills (each row gets its own instruction). All backends (the policy needs only the tokenizer).
    """

    OPTIMIZER = "cpo"

    @dataclass(frozen=True)
    class Args(PromptOptimizer.Args):
        candidates: list[str] = field(default_factory=list)
        num_rewrites: int = 3
        assignments: int = 2
        dims: int = 8
        ridge: float = 1.0
        folds: int = 2
        per_query: bool = True

        def validate(self) -> None:
            PromptOptimizer.Args.validate(self)
            if self.num_rewrites < 0 or self.assignments < 1 or self.dims < 1 or self.ridge <= 0 or self.folds < 2:
                raise ValueError(
                    "CPO needs num_rewrites >= 0, assignments >= 1, dims >= 1, ridge > 0 and folds >= 2; got "
                    f"{self.num_rewrites}, {self.assignments}, {self.dims}, {self.ridge}, {self.folds}."
                )
            if not self.candidates and not self.num_rewrites:
                raise ValueError("CPO needs a pool: candidates, or num_rewrites > 0. Fix: candidates=[...].")

    def _configure(self) -> None:
        super()._configure()
        self.policy: CPOPolicy | None = None

    def instruction_for(self, text: str) -> str:
        if self.policy is None or not self.per_query:
            return super().instruction_for(text)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.policy.pool[self.policy.choose(ids)]

    def _load(self, entry: Path) -> None:
        super()._load(entry)
        self.policy = CPOPolicy.load(entry / "policy.npz", list(self.optimization["pool"]))

    @property
    def vector_hash(self) -> str | None:
        if self.optimization is None:
            return None
        import hashlib

        record = {k: self.optimization.get(k) for k in ("chosen", "pool", "policy_digest", "per_query")}
        return hashlib.sha256(canonical_json(record).encode()).hexdigest()

    def optimize(self, evaluator: Evaluator, proposer: Callable[[str], str], work: Path, out: Path) -> dict[str, Any]:
        tokenizer, rows = evaluator.tokenizer, evaluator.rows
        prompt = PROPOSE_PROMPT.replace("{instruction}", self.initial)
        proposals = [self.propose(proposer, prompt) for _ in range(self.num_rewrites)]
        pool = list(dict.fromkeys([self.initial, *self.candidates, *(p for p in proposals if p)]))
        rng = random.Random(self.seed)
        triples = []
        for i in range(len(rows)):
            for k in rng.sample(range(len(pool)), min(self.assignments, len(pool))):
                triples.append((i, k, evaluator.scores(pool[k], [i])[0]))
        table = evaluator.model.get_input_embeddings().weight.detach().float().cpu().numpy()

        def embed(text: str) -> np.ndarray:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] or [tokenizer.pad_token_id or 0]
            return table[ids].mean(axis=0)

        queries = np.stack([embed(r["input"]) for r in rows])
        instructions = np.stack([embed(p) for p in pool])
        q_center, q_proj = _pca(queries, min(self.dims, len(rows) - 1 or 1))
        t_center, t_proj = _pca(instructions, min(self.dims, len(pool) - 1 or 1))
        x = np.stack([(queries[i] - q_center) @ q_proj for i, _, _ in triples])
        t = np.stack([(instructions[k] - t_center) @ t_proj for _, k, _ in triples])
        y = np.array([score for _, _, score in triples])
        a, b = fit_effect(x, t, y, folds=self.folds, alpha=self.ridge, seed=self.seed)
        policy = CPOPolicy(pool, table @ q_proj, q_center @ q_proj, (instructions - t_center) @ t_proj, a, b)
        policy.save(out / "policy.npz")
        effects = np.stack(
            [policy.pool_features @ (a @ ((queries[i] - q_center) @ q_proj) + b) for i in range(len(rows))]
        )  # [rows, K]
        mean_effect = effects.mean(axis=0)
        fixed = int(np.argmax(mean_effect))
        picks = effects.argmax(axis=1)
        policy_scores = [evaluator.scores(pool[k], [i])[0] for i, k in enumerate(picks)]
        observed = {k: [s for _, kk, s in triples if kk == k] for k in range(len(pool))}
        candidates = [
            {
                "text": text,
                "observed_mean": float(np.mean(observed[k])) if observed[k] else None,
                "observations": len(observed[k]),
                "mean_effect": float(mean_effect[k]),
                "picked_for": int((picks == k).sum()),
                "train_score": evaluator.mean(text) if k == fixed else None,
            }
            for k, text in enumerate(pool)
        ]
        import hashlib

        return {
            "chosen": pool[fixed],
            "pool": pool,
            "per_query": self.per_query,
            "candidates": candidates,
            "train_score_chosen": evaluator.mean(pool[fixed]),
            "train_score_policy": float(np.mean(policy_scores)),
            "triples": len(triples),
            "policy_digest": hashlib.sha256((out / "policy.npz").read_bytes()).hexdigest(),
        }
