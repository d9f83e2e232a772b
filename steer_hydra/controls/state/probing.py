"""Reading activations for fits beyond CAA's mean difference: several modules at once, answer-token reductions,
mean prompt states, and linear probes (ITI's per-head logistic regressions, CAST's thresholds).

Everything runs without gradients through the model (hooks removed before returning, also on errors) and returns
float32 on the CPU. Contrastive pairs are rendered exactly as CAA renders them (`render_pair_split`), so every
fit reads the same tokens for the same pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from steer_hydra.controls.state.caa import render_pair_split
from steer_hydra.core.rendering import has_chat_template
from steer_hydra.core.tensors import pad_left


def pair_batches(
    tokenizer: Any, pairs: Sequence[Mapping[str, Any]], side: str, prompt_format: str, batch_size: int
) -> list[tuple[dict[str, torch.Tensor], list[int]]]:
    """One side of each pair, left-padded in batches: `(encoded batch, answer token count per row)`."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rendered = [render_pair_split(tokenizer, pair, side, prompt_format) for pair in pairs]
    out = []
    for start in range(0, len(rendered), batch_size):
        chunk = rendered[start : start + batch_size]
        ids, mask = pad_left([r[0] for r in chunk], pad)
        out.append(({"input_ids": ids, "attention_mask": mask}, [len(r[0]) - max(r[1], 1) for r in chunk]))
    return out


def prompt_batches(
    tokenizer: Any, texts: Sequence[str], prompt_format: str, batch_size: int
) -> list[dict[str, torch.Tensor]]:
    """Texts as the pipeline sends prompts (a user message with the generation prompt under the chat template when
    `prompt_format='chat'` and the tokenizer has one, else the plain text), left-padded in batches."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = []
    for text in texts:
        if prompt_format == "chat" and has_chat_template(tokenizer):
            head = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            rows.append(list(tokenizer(head, add_special_tokens=False)["input_ids"]))
        else:
            rows.append(list(tokenizer(text)["input_ids"]))
    batches = []
    for start in range(0, len(rows), batch_size):
        ids, mask = pad_left(rows[start : start + batch_size], pad)
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def capture(
    model: torch.nn.Module, sites: Mapping[str, tuple[str, str]], batches: Sequence[Mapping[str, torch.Tensor]]
) -> list[dict[str, torch.Tensor]]:
    """Per batch, `{name: [batch, seq, width]}` read at each named site `(module path, "input" | "output")` in one
    forward (a module's first input, or its output hidden states), float32 on the CPU."""
    from steer_hydra.controls.state.residual import input_hidden, output_hidden

    seen: dict[str, list[torch.Tensor]] = {name: [] for name in sites}
    handles = []
    for name, (path, where) in sites.items():
        module = model.get_submodule(path)
        if where == "input":

            def read_input(module, args, kwargs, name=name):
                seen[name].append(input_hidden(args, kwargs).detach().float().cpu())

            handles.append(module.register_forward_pre_hook(read_input, with_kwargs=True))
        elif where == "output":

            def read_output(module, args, kwargs, output, name=name):
                seen[name].append(output_hidden(output).detach().float().cpu())

            handles.append(module.register_forward_hook(read_output, with_kwargs=True))
        else:
            raise ValueError(f"capture reads a module's 'input' or 'output'; got {where!r}.")
    device = next(model.parameters()).device
    results = []
    try:
        with torch.no_grad():
            for batch in batches:
                for values in seen.values():
                    values.clear()
                ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
                model(input_ids=ids, attention_mask=mask, use_cache=False)
                for name, values in seen.items():
                    if len(values) != 1:
                        raise RuntimeError(f"Expected one forward through {sites[name][0]!r}; saw {len(values)}.")
                results.append({name: values[0] for name, values in seen.items()})
    finally:
        for handle in handles:
            handle.remove()
    return results


def answer_reduce(block: torch.Tensor, lengths: Sequence[int], accumulate: str, owner: str) -> torch.Tensor:
    """`[rows, width]`: each left-padded row's last token (`last_token`) or the mean over its last `length` tokens,
    the answer's (`completion`)."""
    rows = []
    for row, length in enumerate(lengths):
        if length < 1:
            raise ValueError(f"{owner}: a pair's answer has no token after its prompt.")
        answer = block[row, -length:]
        rows.append(answer[-1] if accumulate == "last_token" else answer.mean(dim=0))
    return torch.stack(rows)


def masked_mean(block: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[rows, width]`: the mean over each row's real positions (the mask's ones) of `[rows, seq, width]`."""
    weights = mask.to(block.dtype)
    return (block * weights[..., None]).sum(1) / weights.sum(1, keepdim=True).clamp_min(1)


def split_pairs(count: int, validation_fraction: float, seed: int, owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair indices `(train, validation)`: a seeded permutation, `max(1, round(fraction * count))` held out."""
    if count < 2:
        raise ValueError(
            f"{owner} needs at least 2 contrastive pairs (one to fit probes on, one to validate them); got {count}. "
            "Fix: give more pairs."
        )
    held = min(max(1, round(validation_fraction * count)), count - 1)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return order[held:].sort().values, order[:held].sort().values


def fit_probes(
    features: torch.Tensor, labels: torch.Tensor, *, l2: float, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent logistic regressions, one per probe: `features` `[samples, probes, dim]`, `labels` `[samples]`
    in {0, 1}. Features are standardised per probe and dimension; the objective per probe is the mean log loss
    plus `l2 / 2 * |w|^2`, minimised jointly (the probes share nothing) with L-BFGS. Returns `(weights [probes,
    dim], bias [probes])` in the original feature units."""
    x = features.double()
    mean = x.mean(0)
    std = x.std(0, unbiased=False).clamp_min(1e-8)
    z = (x - mean) / std
    y = labels.double()[:, None].expand(-1, x.shape[1])
    weights = torch.zeros(x.shape[1], x.shape[2], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        logits = torch.einsum("npd,pd->np", z, weights) + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(0).sum()
        loss = loss + 0.5 * l2 * (weights * weights).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
    raw = (weights / std).detach()
    return raw.float(), (bias - (raw * mean).sum(-1)).detach().float()


def probe_scores(
    features: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per probe: accuracy of `logit > 0` against `labels`, and the mean log likelihood of the labels."""
    logits = torch.einsum("npd,pd->np", features.double(), weights.double()) + bias.double()
    y = labels.double()[:, None].expand_as(logits)
    accuracy = ((logits > 0).double() == y).double().mean(0)
    likelihood = -torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(0)
    return accuracy.float(), likelihood.float()


def best_threshold(
    on: torch.Tensor, off: torch.Tensor, comparisons: Sequence[str] = (">", "<")
) -> tuple[float, str, float]:
    """`(threshold, comparison, accuracy)` separating scores that should open a gate (`on`) from those that should
    not (`off`): every midpoint between sorted distinct scores, with each of `comparisons`; the best accuracy wins,
    ties go to the widest margin, then to the first comparison."""
    scores = torch.cat([on, off]).double()
    truth = torch.cat([torch.ones_like(on, dtype=torch.bool), torch.zeros_like(off, dtype=torch.bool)])
    values = scores.unique(sorted=True)
    if values.numel() < 2:
        raise ValueError("Every prompt has the same condition similarity, so no threshold separates them.")
    midpoints = (values[1:] + values[:-1]) / 2
    gaps = values[1:] - values[:-1]
    best: tuple[float, float, int, float, str] | None = None
    for threshold, gap in zip(midpoints.tolist(), gaps.tolist(), strict=True):
        for rank, comparison in enumerate(comparisons):
            predicted = scores > threshold if comparison == ">" else scores < threshold
            accuracy = float((predicted == truth).double().mean())
            key = (accuracy, gap, -rank, threshold, comparison)
            if best is None or key[:3] > best[:3]:
                best = key
    assert best is not None
    return best[3], best[4], best[0]


def pair_means(
    model: torch.nn.Module,
    tokenizer: Any,
    layer_path: str,
    pairs: Sequence[Mapping[str, Any]],
    *,
    prompt_format: str,
    accumulate: str,
    batch_size: int,
    owner: str,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """`(positive mean, negative mean, median norm)` of a layer's output over the pairs' answers, each side read
    as CAA reads it (the answer's last token or its tokens' mean); the median L2 norm is over every answer token of
    both sides (CAA's `median_norm`)."""
    means, norms = [], []
    for side in ("positive", "negative"):
        batches = pair_batches(tokenizer, pairs, side, prompt_format, batch_size)
        captured = capture(model, {"layer": (layer_path, "output")}, [b for b, _ in batches])
        rows = []
        for block, (_, lengths) in zip(captured, batches, strict=True):
            rows.append(answer_reduce(block["layer"], lengths, accumulate, owner))
            norms += [block["layer"][row, -length:].norm(dim=-1) for row, length in enumerate(lengths)]
        means.append(torch.cat(rows).mean(dim=0))
    return means[0], means[1], float(torch.cat(norms).median())


def prompt_means(
    model: torch.nn.Module,
    tokenizer: Any,
    layer_path: str,
    texts: Sequence[str],
    *,
    prompt_format: str,
    batch_size: int,
) -> torch.Tensor:
    """`[texts, hidden]`: a layer's output averaged over each text's prompt tokens, the text rendered as the
    pipeline renders a prompt (`prompt_batches`): what a condition reads at inference."""
    batches = prompt_batches(tokenizer, texts, prompt_format, batch_size)
    captured = capture(model, {"layer": (layer_path, "output")}, batches)
    return torch.cat(
        [masked_mean(block["layer"], batch["attention_mask"]) for block, batch in zip(captured, batches, strict=True)]
    )
