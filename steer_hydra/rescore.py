"""`python -m steer_hydra.rescore <dir> judge=<model> [key=value ...]`: judge finished concept-steering logs with a
model judge without generating again, then rewrite the tables and write `agreement.csv` (`app/rescore.py`)."""

from __future__ import annotations

import sys

from steer_hydra.app.rescore import main

if __name__ == "__main__":
    sys.exit(main())
