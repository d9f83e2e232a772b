"""The held-out steering study: points chosen on dev per concept, reported on test, summarised over concepts.

- `plan`: `StudyPlan` (arms, concepts, grids over strength x layer and PASTA's alpha, suites) and its jobs;
- `selection`: `Objective`, `select_points` (dev rows only), `chosen_points`;
- `report`: `study_frame` (a save_dir's samples labelled by what was launched), `write_study` (per-concept and
  cross-concept statistics, win rates, capability costs, files, plots) and the text tables;
- `curves`: `strength_curves` (the dev objective against strength, per concept and over concepts, with intervals);
- `page`: `write_page` (the study folder's `index.html`);
- `run`: `run_study` (dev jobs, the choice, report jobs, the report) over any launcher, and `report_study`;
- `python -m steer_hydra.study <sweep dir>/study`: the report of a study written again from its files.

The Hydra sweeper (`hydra_plugins/steer_hydra_study`) is a shim over `steer_hydra.app.study.sweep_study`, which
launches through Hydra and adds the console tables and W&B. Statistics come from `analysis.stats`.
"""

from __future__ import annotations

LAUNCHED_FILE = "launched_jobs.json"  # <sweep dir>/launched_jobs.json: the jobs a planning sweeper launched so far
PLANNED_FILE = "planned_jobs.json"  # <sweep dir>/planned_jobs.json: a study's job count per phase, before any job
