"""Linear probes on a model's own representations: the last token's final hidden state, and classes fitted on it.

Used by `SASA` (the margin of a context plus a candidate token against an unwanted-attribute subspace) and by
`RoutedDecoding` (a route chosen from the prompt). Nothing here generates text.

How it runs: `last_token_states` runs the model's trunk (`model.base_model`, the decoder without its head: the
final hidden state after the last norm) on left-padded rows, positions counted from each row's first real token,
and reads the last column (every row's last real token, as the rows are left-padded). `fit_linear_probe` fits
linear discriminant analysis in closed form: class means, one pooled covariance shrunk toward a multiple of the
identity (`shrinkage`, so a handful of examples in a wide hidden space still give a stable direction), and per
class `w_c = S^-1 mu_c`, `b_c = -mu_c S^-1 mu_c / 2` (equal priors). With two classes the probe also exposes the
signed margin of the Bayes-optimal boundary along a unit direction: positive on the wanted side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.controls.output.auxiliary import positions
from steer_hydra.core.rendering import has_chat_template
from steer_hydra.core.tensors import pad_left


@dataclass(frozen=True, slots=True)
class LinearProbe:
    """Linear scores of hidden states: `states @ weight.T + bias`, one column per class (`classes`).

    Attributes:
        classes: the class names, in column order.
        weight: `[C, H]` float32 on the CPU.
        bias: `[C]` float32.
    """

    classes: tuple[str, ...]
    weight: torch.Tensor
    bias: torch.Tensor

    def scores(self, states: torch.Tensor) -> torch.Tensor:
        """`[N, C]` class scores of `[N, H]` states (computed in float32)."""
        weight = self.weight.to(states.device)
        return states.float() @ weight.T + self.bias.to(states.device)

    def predict(self, states: torch.Tensor) -> list[str]:
        """The highest-scoring class of each state (the first on ties)."""
        return [self.classes[int(i)] for i in self.scores(states).argmax(dim=-1).tolist()]


@dataclass(frozen=True, slots=True)
class Margin:
    """A signed distance along a unit `direction`: `states @ direction + offset` (positive: the wanted side)."""

    direction: torch.Tensor
    offset: float

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        """`[...]` margins of `[..., H]` states, in the states' dtype."""
        direction = self.direction.to(device=states.device, dtype=states.dtype)
        return states @ direction + self.offset


def fit_linear_probe(
    states: torch.Tensor, labels: Sequence[str], *, shrinkage: float = 0.05, owner: str = "fit_linear_probe"
) -> LinearProbe:
    """Closed-form LDA on `[N, H]` states with one label per row (at least two classes, each seen twice)."""
    if states.dim() != 2 or states.shape[0] != len(labels):
        raise ValueError(
            f"{owner}: {states.shape[0]} states for {len(labels)} labels. Fix: give one label per example."
        )
    classes = tuple(dict.fromkeys(labels))
    counts = {c: sum(1 for label in labels if label == c) for c in classes}
    if len(classes) < 2 or min(counts.values()) < 2:
        raise ValueError(
            f"{owner}: a probe needs at least two classes with two examples each; got {counts}. "
            "Fix: add labeled examples for every class."
        )
    x = states.double()
    means = torch.stack([x[[i for i, label in enumerate(labels) if label == c]].mean(0) for c in classes])
    centered = x - means[[classes.index(label) for label in labels]]
    pooled = centered.T @ centered / max(x.shape[0] - len(classes), 1)
    hidden = pooled.shape[0]
    scale = float(torch.trace(pooled)) / hidden
    if not math.isfinite(scale) or scale <= 0:
        scale = 1.0  # every class a single point: the identity alone (nearest class mean)
    covariance = (1 - shrinkage) * pooled + shrinkage * scale * torch.eye(hidden, dtype=x.dtype)
    weight = torch.linalg.solve(covariance, means.T).T  # [C, H]
    bias = -0.5 * (weight * means).sum(-1)
    return LinearProbe(classes, weight.float(), bias.float())


def two_class_margin(probe: LinearProbe, wanted: str) -> Margin:
    """The margin of a two-class probe toward `wanted`, along the unit direction of its score difference."""
    if len(probe.classes) != 2 or wanted not in probe.classes:
        raise ValueError(f"two_class_margin needs a two-class probe holding {wanted!r}; got {probe.classes}.")
    good = probe.classes.index(wanted)
    w = probe.weight[good] - probe.weight[1 - good]
    b = float(probe.bias[good] - probe.bias[1 - good])
    norm = float(w.norm())
    if norm == 0 or not math.isfinite(norm):
        raise ValueError("The fitted classes are indistinguishable (zero direction). Fix: give examples that differ.")
    return Margin((w / norm).float(), b / norm)


@torch.no_grad()
def last_token_states(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[N, H]` final hidden states (after the last norm) at the last column of left-padded rows."""
    trunk = trunk_of(model)
    device = model.get_input_embeddings().weight.device
    ids, mask = ids.to(device), mask.to(device)
    out = trunk(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    return out.last_hidden_state[:, -1]


def trunk_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder of a causal LM without its output head (`base_model`), whose output is the final hidden state."""
    trunk = getattr(model, "base_model", None)
    if trunk is None or trunk is model:
        raise ValueError(
            f"{type(model).__name__} exposes no decoder trunk (base_model) whose last hidden state a probe can read. "
            "Fix: use a transformers *ForCausalLM model."
        )
    return trunk


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of plain texts (with the tokenizer's special tokens, e.g. a BOS)."""
    return [list(tokenizer(text)["input_ids"]) for text in texts]


def encode_chats(tokenizer: Any, chats: Sequence[Sequence[Mapping[str, str]]], *, generation_prompt: bool) -> list:
    """Token ids of chats rendered by the chat template (the rows the pipeline's messages path builds)."""
    rows = []
    for chat in chats:
        encoded = tokenizer.apply_chat_template(
            list(chat), add_generation_prompt=generation_prompt, tokenize=True, return_dict=True
        )
        rows.append(list(encoded["input_ids"]))
    return rows


def prompt_rows(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """The rows a prompt becomes on the pipeline's messages path (one user turn, generation prompt), or as plain
    text without a chat template."""
    if has_chat_template(tokenizer):
        return encode_chats(tokenizer, [[{"role": "user", "content": p}] for p in prompts], generation_prompt=True)
    return encode_texts(tokenizer, prompts)


def exchange_rows(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[list[int]]:
    """The rows of (prompt, response) exchanges as the model reads them while it writes the response: the prompt's
    row (`prompt_rows`) followed by the response's tokens (no special tokens, no end-of-turn marker)."""
    prompts = prompt_rows(tokenizer, [p for p, _ in pairs])
    return [
        row + list(tokenizer.encode(r, add_special_tokens=False)) for row, (_, r) in zip(prompts, pairs, strict=True)
    ]


def states_of_rows(
    model: torch.nn.Module, rows: Sequence[Sequence[int]], pad_token_id: int | None, batch_size: int = 8
) -> torch.Tensor:
    """`[N, H]` last-token final hidden states of token rows, `batch_size` rows per forward (float32, CPU)."""
    out = []
    for start in range(0, len(rows), batch_size):
        ids, mask = pad_left(rows[start : start + batch_size], pad_token_id)
        out.append(last_token_states(model, ids, mask).float().cpu())
    return torch.cat(out)
