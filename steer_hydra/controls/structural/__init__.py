"""Structural controls: they change the model itself at `steer()` (adapters, merged weights)."""

from steer_hydra.controls.structural.lora import LoRAAdapter, LoRAArtifact, adapter_digest

__all__ = ["LoRAAdapter", "LoRAArtifact", "adapter_digest"]
