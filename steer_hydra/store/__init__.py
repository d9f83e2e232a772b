"""The save_dir: one owner of its layout, cell index, locks and configuration records (`SaveDir`), of the claims on
a suite's protocol (`SuiteClaim`), and of the one answer to "are two evaluations comparable?" (`comparable`)."""

from steer_hydra.store.claims import SuiteClaim
from steer_hydra.store.comparable import cell_key, evaluation_setting, protocol
from steer_hydra.store.save_dir import Cell, SaveDir

__all__ = ["Cell", "SaveDir", "SuiteClaim", "cell_key", "evaluation_setting", "protocol"]
