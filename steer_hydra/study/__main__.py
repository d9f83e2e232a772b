"""`python -m steer_hydra.study STUDY_DIR`: a study's report written again from its plan and launched table."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from steer_hydra.study.report import costs_table, study_table, summary_table
from steer_hydra.study.run import report_study


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m steer_hydra.study", description=__doc__.splitlines()[0])
    parser.add_argument("study_dir", help="a study sweep's <sweep dir>/study folder (plan.json, launched.csv)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    out = report_study(args.study_dir)
    for table, text in ((out["results"], study_table), (out["summary"], summary_table)):
        if not table.empty:
            print(text(table))  # noqa: T201 - a command's output
    if not out["costs_summary"].empty:
        print(costs_table(out["costs_summary"]))  # noqa: T201


if __name__ == "__main__":
    main()
