#!/usr/bin/env bash
# The tests, in two pytest sessions: the main suite (every test not marked slow or cluster; minutes), then the slow
# tests (whole jobs in subprocesses, sweeps, SmolLM2 end to end). Arguments go to both sessions; JUNIT_DIR=<dir>
# writes each session's report there (junit-main.xml, junit-slow.xml). Cluster tests: docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/.."
report() { if [ -n "${JUNIT_DIR:-}" ]; then echo "--junitxml=$JUNIT_DIR/junit-$1.xml"; fi; }
# shellcheck disable=SC2046 # report prints one argument or none
.venv/bin/python -m pytest -q $(report main) "$@"
# shellcheck disable=SC2046
.venv/bin/python -m pytest -q -m 'slow and not cluster' $(report slow) "$@"
