"""The held-out steering study: strengths chosen on dev, statistics reported on test, capability costs.

- `selection`: `Objective`, `select_strengths` (dev rows only), `at_chosen_strength`, `strength_of`;
- `report`: `study_frame` (a save_dir's samples with `strength` and `split`), `report_selected`, `report_costs`,
  `write_study` (the study's files), `study_table` / `costs_table` (text);
- `python -m steer_hydra.study SAVE_DIR OUT_DIR`: the selection and report of a save_dir after the fact.

The Hydra sweeper that runs a study in one multirun (`hydra_plugins/steer_hydra_study`) and the W&B logging
(`steer_hydra.app.study`) are thin layers over these functions. Statistics come from `evaluation.stats`.
"""

from __future__ import annotations

LAUNCHED_FILE = "launched_jobs.json"  # <sweep dir>/launched_jobs.json: the jobs a planning sweeper launched so far
