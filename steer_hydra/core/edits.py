"""The arithmetic of `ResidualAddition` edits that both executors share: the Hugging Face hooks
(`steer_hydra.controls.state.edits`) and the vLLM worker plugin (`steer_hydra.backends.vllm.plugin`).

One definition of a rotation in a plane and of a condition's gate decision, so the two backends cannot drift apart.
Every function is pure (out of place) and broadcasts over leading dimensions.

Invariants:
- `rotate_in_plane` keeps the component of the stream orthogonal to the plane exactly as it was (up to the
  rounding of the two coordinates it subtracts and adds back) and keeps the stream's norm (the plane component's
  length is kept); it computes in float32 at least and returns the stream's dtype;
- `condition_similarity` is the cosine between a mean hidden state m and its projection on the unit condition
  direction c, `|m.c| / |m|` (0 for m = 0): CAST's similarity, blind to the sign of m.c.
"""

from __future__ import annotations

import torch


def rotate_in_plane(
    stream: torch.Tensor,
    first: torch.Tensor,
    second: torch.Tensor,
    cos: torch.Tensor | float,
    sin: torch.Tensor | float,
    *,
    to_angle: bool,
) -> torch.Tensor:
    """`stream` with its component in the plane of the orthonormal `first` and `second` rotated by the angle whose
    cosine and sine are given (from `first` toward `second`), or, with `to_angle`, set to that angle from `first`
    with its length kept. Shapes broadcast (`[..., width]` rows; cos and sin `[..., 1]` or scalars)."""
    compute = torch.promote_types(stream.dtype, torch.float32)
    s, b1, b2 = stream.to(compute), first.to(compute), second.to(compute)
    p1 = (s * b1).sum(-1, keepdim=True)
    p2 = (s * b2).sum(-1, keepdim=True)
    if to_angle:
        length = torch.sqrt(p1 * p1 + p2 * p2)
        n1, n2 = length * cos, length * sin
    else:
        n1 = cos * p1 - sin * p2
        n2 = sin * p1 + cos * p2
    return (s + (n1 - p1) * b1 + (n2 - p2) * b2).to(stream.dtype)


def condition_similarity(mean: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """`cos(m, (m.c) c)` for unit c, i.e. `|m.c| / |m|` (0 where m is 0), over the last dimension, in float32+."""
    compute = torch.promote_types(mean.dtype, torch.float32)
    m, c = mean.to(compute), unit.to(compute)
    along = (m * c).sum(-1).abs()
    norm = m.norm(dim=-1)
    return torch.where(norm > 0, along / norm.clamp_min(torch.finfo(compute).tiny), torch.zeros_like(norm))


def gate_open(similarity: torch.Tensor, threshold: float, comparison: str) -> torch.Tensor:
    """Whether a condition's gate opens: `similarity > threshold` or `similarity < threshold`."""
    if comparison == ">":
        return similarity > threshold
    if comparison == "<":
        return similarity < threshold
    raise ValueError(f"A condition's comparison must be '>' or '<'; got {comparison!r}.")
