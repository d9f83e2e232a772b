"""State controls: hooks on attention and the residual stream during a call (PASTA, CAA, ActAdd,
DirectionalAblation, ITI, CAST, AngularSteering, ActivationAdapter). The contrastive datasets the concept configs
fit vectors from are concept files, read by `steer_hydra.tasks.concepts`."""

from steer_hydra.controls.state.ablation import DirectionalAblation
from steer_hydra.controls.state.actadd import ActAdd
from steer_hydra.controls.state.adapter import ActivationAdapter
from steer_hydra.controls.state.angular import AngularSteering
from steer_hydra.controls.state.caa import CAA
from steer_hydra.controls.state.cast import CAST
from steer_hydra.controls.state.iti import ITI
from steer_hydra.controls.state.pasta import PASTA
from steer_hydra.controls.state.vectors import SteeringVector

__all__ = [
    "CAA",
    "CAST",
    "ITI",
    "PASTA",
    "ActAdd",
    "ActivationAdapter",
    "AngularSteering",
    "DirectionalAblation",
    "SteeringVector",
]
