"""steer_hydra: evaluate steering pipelines on Inspect AI, configured with Hydra, tracked in W&B."""

from steer_hydra.core import SteeringPipeline

__version__ = "0.1.0"
__all__ = ["SteeringPipeline", "__version__"]
