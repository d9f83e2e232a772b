"""`python -m steer_hydra --help` lists every config group with all its options, and no internal schema groups."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import steer_hydra

CONF = Path(steer_hydra.__file__).parent / "conf"


def test_help_lists_every_group_and_option_and_hides_the_schema_groups():
    proc = subprocess.run(
        [sys.executable, "-m", "steer_hydra", "--help"], capture_output=True, text=True, timeout=120, check=True
    )
    text = proc.stdout
    assert "schema/" not in text and "Usage: python -m steer_hydra" in text and "Examples:" in text
    groups = sorted(p for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__"))
    assert {g.name for g in groups} >= {"model", "arm", "control", "suite", "provider", "backend", "logger"}
    for group in groups:
        section = re.search(rf"^  {re.escape(group.name)} +(.*?)(?=^  \S|^\S|\Z)", text, re.M | re.S)
        assert section, f"--help has no line for the {group.name} group"
        listed = set(re.findall(r"[\w.-]+", section.group(1)))
        missing = sorted(p.stem for p in group.glob("*.yaml") if p.stem not in listed)
        assert not missing, f"--help misses {group.name} options {missing}: add them to hydra.help in config.yaml"
