"""Capability atoms, the support report `check()` returns, and the error `steer()` raises on it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Capability(enum.StrEnum):
    """What a backend can do; controls name the atoms they need in `requirements()`."""

    IN_PROCESS_TORCH = "in_process_torch"  # live nn.Module: hooks, attention functions, logits processors
    HIDDEN_CAPTURE = "hidden_capture"  # read hidden states (fitting steering vectors)
    BEAM_PROPOSALS = "beam_proposals"  # num_beams > 1 rollouts
    SAMPLED_ROLLOUTS = "sampled_rollouts"  # n sampled continuations per prompt
    SERVE_CHECKPOINT = "serve_checkpoint"  # serve a checkpoint produced at steer()


@dataclass(frozen=True, slots=True)
class SupportFailure:
    """One unsupported (control, backend) combination and what to do about it."""

    control: str
    phase: str
    message: str

    def __str__(self) -> str:
        return f"{self.control} ({self.phase}): {self.message}"


@dataclass(frozen=True, slots=True)
class SupportReport:
    """The result of `SteeringPipeline.check()`: empty `failures` means the pipeline can run."""

    backend: str
    failures: tuple[SupportFailure, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.failures

    def messages(self) -> list[str]:
        return [str(f) for f in self.failures]

    def __str__(self) -> str:
        if self.ok:
            return f"Pipeline supported on backend {self.backend!r}."
        lines = "\n".join(f"  - {m}" for m in self.messages())
        return f"Pipeline not supported on backend {self.backend!r}:\n{lines}"


class UnsupportedPipelineError(RuntimeError):
    """Raised by `steer()` when `check()` reports failures; carries the report."""

    def __init__(self, report: SupportReport) -> None:
        super().__init__(str(report))
        self.report = report
