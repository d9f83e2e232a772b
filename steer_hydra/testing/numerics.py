"""Float comparisons for tests, with the tolerance derived from the arithmetic being compared.

Two float computations of one value that round in another order (another batch shape, another BLAS kernel, another
CPU) differ by a few units in the last place (ulps) of the magnitudes they combine, not of the result: an element
near zero that is the difference of terms of magnitude 4 carries the rounding of 4, so a fixed `atol=1e-6` (or a
tolerance relative to each element) is tighter than the arithmetic there. Rounding errors that accumulate along
an element's computation are independent and of either sign, so they grow like the square root of their number,
and the tolerance is

    atol = ulps * eps(dtype) * scale * sqrt(terms)

where `scale` is the largest magnitude among the compared values and any `operands` named (the terms summed),
`terms` the number of roundings that accumulate into one element (a dot product of length n: n; k chained layers
of them: k * n) and `ulps` about two (one rounding of each side). Where exactness is the claim (a release that
restores weights, a copy, an identity) compare with `torch.equal` instead.
"""

from __future__ import annotations

import math

import torch

__all__ = ["assert_equal_up_to_rounding", "decoder_roundings", "rounding_atol"]


def _magnitude(value: torch.Tensor | float) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().abs().max()) if value.numel() else 0.0
    return abs(float(value))


def rounding_atol(
    *operands: torch.Tensor | float, terms: int = 1, ulps: float = 2.0, dtype: torch.dtype = torch.float32
) -> float:
    """The absolute tolerance two computations of one value in `dtype` may differ by after `terms` roundings on
    values up to the largest magnitude among `operands` (see the module docstring)."""
    if terms < 1:
        raise ValueError(f"terms={terms}: the number of roundings is at least 1. Fix: pass terms>=1.")
    scale = max((_magnitude(value) for value in operands), default=0.0)
    return ulps * torch.finfo(dtype).eps * scale * math.sqrt(terms)


def assert_equal_up_to_rounding(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    terms: int,
    operands: tuple[torch.Tensor | float, ...] = (),
    ulps: float = 2.0,
    msg: object = None,
) -> None:
    """Assert `actual` equals `expected` but for the rounding of `terms` accumulated operations on magnitudes up to
    the largest among both and `operands` (torch's assert_close message, with the tolerance and `msg`)."""
    dtype = expected.dtype if expected.is_floating_point() else torch.float32
    atol = rounding_atol(actual, expected, *operands, terms=terms, ulps=ulps, dtype=dtype)

    def message(default: str) -> str:
        detail = f"{default}\n(tolerance {atol:.3g} = {ulps} ulps of the largest magnitude x sqrt({terms} roundings))"
        return f"{msg}: {detail}" if msg is not None else detail

    torch.testing.assert_close(actual, expected, rtol=0.0, atol=atol, msg=message)


def decoder_roundings(config: object, tokens: int) -> int:
    """The roundings that accumulate into one logit of a decoder-only transformer with `config` (a transformers
    config) over `tokens` positions: per layer the query, key, value and output projections (a dot product over the
    hidden size each), the attention scores (over the head size) and their weighted sum (over the positions), the
    MLP's projections (over the hidden and the intermediate size) and the two residual sums; then the output head
    (over the hidden size)."""
    hidden = int(config.hidden_size)
    head = int(getattr(config, "head_dim", None) or hidden // int(config.num_attention_heads))
    per_layer = 4 * hidden + head + tokens + 2 * hidden + int(config.intermediate_size) + 2
    return int(config.num_hidden_layers) * per_layer + hidden
