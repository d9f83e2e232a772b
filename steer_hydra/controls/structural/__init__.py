"""Structural controls: they change the model itself at `steer()` (adapters, other checkpoints, merged or trained
weights), in place on Hugging Face, restored exactly at release."""

from steer_hydra.controls.structural.checkpoint import LoadCheckpoint, WeightSwap
from steer_hydra.controls.structural.lora import LoRAAdapter, LoRAArtifact, adapter_digest
from steer_hydra.controls.structural.merge import ModelMerge
from steer_hydra.controls.structural.train import DPOAdapter, SFTAdapter, TrainedAdapter

__all__ = [
    "DPOAdapter",
    "LoRAAdapter",
    "LoRAArtifact",
    "LoadCheckpoint",
    "ModelMerge",
    "SFTAdapter",
    "TrainedAdapter",
    "WeightSwap",
    "adapter_digest",
]
