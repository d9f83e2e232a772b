"""`python -m steer_hydra.aggregate <sweep dir> [--no-tracking]`: (re-)aggregate a sweep from its directory.

Reads the sweep's `multirun.yaml` and every `*/job_record.json` under it, writes `<sweep dir>/aggregate/`
(paired deltas of the sweep's configurations vs the baseline, summary, plots, `missing_cells.json` with the
command that completes each missing job) and, unless `--no-tracking`, the W&B summary runs as the sweep would.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m steer_hydra.aggregate", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a multirun directory (holds multirun.yaml)")
    parser.add_argument("--no-tracking", action="store_true", help="write the files only, no W&B summary run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s")
    config_path = args.sweep_dir / "multirun.yaml"
    if not config_path.is_file():
        print(
            f"steer_hydra.aggregate: {config_path} not found. Fix: pass the sweep directory Hydra printed "
            "(outputs/<experiment>/multiruns/<time>).",
            file=sys.stderr,
        )
        return 2
    from steer_hydra.app.callbacks import aggregate_sweep_dir

    out = aggregate_sweep_dir(args.sweep_dir, OmegaConf.load(config_path), track=not args.no_tracking)
    if out is None:
        return 1
    print(args.sweep_dir / "aggregate")
    return 1 if out["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
