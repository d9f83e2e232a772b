"""Controls whose state edits are trained at `steer()` from the arm's rows and cached by content digest: LoReFT (a
low-rank representation edit at prompt positions, written from the ReFT paper)."""

from steer_hydra.controls.trained.reft import LoReFT

__all__ = ["LoReFT"]
