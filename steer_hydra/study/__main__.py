"""`python -m steer_hydra.study SAVE_DIR OUT_DIR`: the study's selection and report of a save_dir, after the fact."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from steer_hydra.study.report import STUDY_SCORES, costs_table, study_frame, study_table, write_study
from steer_hydra.study.selection import Objective
from steer_hydra.tasks.concept_steering import split_ids

SANITY_ARMS = ("caa_weddings_random", "caa_weddings_negated")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m steer_hydra.study", description=__doc__.splitlines()[0])
    parser.add_argument("save_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--objective", default="concept_harmonic")
    parser.add_argument("--swept", nargs="*", default=["caa_weddings", *SANITY_ARMS])
    parser.add_argument("--follows", nargs="*", default=[f"{arm}=caa_weddings" for arm in SANITY_ARMS])
    parser.add_argument("--task", default="steer_hydra/concept_steering")
    parser.add_argument("--strengths", nargs="*", type=float, default=None, help="the grid (default: every one)")
    parser.add_argument("--cost-suites", nargs="*", default=["capability_offline"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    split_of = {i: "dev" for i in split_ids("dev")} | {i: "test" for i in split_ids("test")}
    samples = study_frame(args.save_dir, split_of=split_of, swept=args.swept)
    present = set(samples["arm_name"])
    follows = {arm: parent for arm, parent in (item.split("=", 1) for item in args.follows) if arm in present}
    out = write_study(
        samples,
        args.out_dir,
        objective=Objective(args.objective),
        scores=STUDY_SCORES,
        follows=follows,
        task=args.task,
        strengths=args.strengths,
        cost_suites=args.cost_suites,
    )
    print(study_table(out["results"]))  # noqa: T201 - a command's output
    if not out["costs"].empty:
        print(costs_table(out["costs"]))  # noqa: T201


if __name__ == "__main__":
    main()
