"""The trained, merged and optimized controls through the app: one sweep on the tiny model runs each control's option
beside the baseline (arms from a search path, as a user's would be), every arm changes some completion against the
baseline's, the results table names every arm with its config id, and a second sweep reuses every trained adapter,
merge and chosen prompt from the cache instead of building it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_helpers import SMALL, check_arms_beside_baseline, job_records, sweep_dir, write_arms

pytest.importorskip("trl")
pytest.importorskip("mergekit")
pytest.importorskip("gepa")

TRAIN_STEPS = "max_steps: 2, learning_rate: 0.01, save_steps: 100"
OPTIMIZE = "max_new_tokens: 6, proposal_tokens: 8"


def _arms(root: Path, data: Path, rows: Path) -> tuple[str, dict[str, str]]:
    """Arm files for every new control under `root/user_conf/arm`; returns the search-path override and the arms."""
    arms = {
        "checkpoint": "defaults:\n  - /control@controls.ckpt: load_checkpoint\n"
        "controls:\n  ckpt: {checkpoint: 'steer_hydra:tiny?seed=1'}",
        "merge": "defaults:\n  - /control@controls.merge: model_merge\ncontrols:\n  merge:\n"
        "    models: [{model: 'steer_hydra:tiny', weight: 0.5}, {model: 'steer_hydra:tiny?seed=1', weight: 0.5}]",
        "sft": "defaults:\n  - /control@controls.sft: sft_adapter\n"
        f"controls:\n  sft: {{data: '{data}', {TRAIN_STEPS}}}",
        "dpo": "defaults:\n  - /control@controls.dpo: dpo_adapter\n"
        f"controls:\n  dpo: {{data: '{data}', {TRAIN_STEPS}}}",
        "reft": "defaults:\n  - /control@controls.reft: loreft\n"
        f"controls:\n  reft: {{data: '{data}', layer: 0, epochs: 10, learning_rate: 0.01}}",
        "prewrite": "defaults:\n  - /control@controls.opt: prewrite\n"
        f"controls:\n  opt: {{data: '{rows}', rl_steps: 1, num_generations: 2, reward_rows: 1, num_rewrites: 1, "
        f"{OPTIMIZE}}}",
        "cpo": f"defaults:\n  - /control@controls.opt: cpo\ncontrols:\n  opt: {{data: '{rows}', num_rewrites: 0, "
        f"{OPTIMIZE}}}",
        "gepa": f"defaults:\n  - /control@controls.opt: gepa\ncontrols:\n  opt: {{data: '{rows}', max_metric_calls: 6, "
        f"minibatch_size: 1, {OPTIMIZE}}}",
    }
    return write_arms(root, arms), arms


def _cache_entries(cache: Path) -> dict[str, set[str]]:
    return {
        kind: {p.name for p in (cache / kind).iterdir() if not p.name.startswith(".")}
        for kind in ("adapters", "merges", "prompts", "reft")
        if (cache / kind).is_dir()
    }


@pytest.mark.slow
def test_every_new_control_runs_in_a_sweep_beside_the_baseline_and_reuses_its_cache(run_main, tmp_path):
    import os

    pairs = [
        {"prompt": f"tell me about the {w}", "positive": f"the {w} is kind", "negative": f"the {w} is rude"}
        for w in ("cat", "dog", "bird", "fish")
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"input": f"what is the capital of {c}", "reference": "paris"}) + "\n"
            for c in ("france", "spain", "italy")
        )
    )
    search, arms = _arms(tmp_path, data, rows)
    names = list(arms)
    code, out, err = run_main("--multirun", "model=tiny", search, f"arm=baseline,{','.join(names)}", *SMALL)
    assert code == 0, err[-3000:]
    sweep = sweep_dir(tmp_path)
    ids, _ = check_arms_beside_baseline(sweep, names, out)
    cache = Path(os.environ["STEER_HYDRA_CACHE"])
    built = _cache_entries(cache)
    assert len(built["adapters"]) >= 2 and len(built["merges"]) >= 1 and len(built["prompts"]) >= 3
    assert len(built["reft"]) >= 1
    # what an optimizer chose at steer() reaches its job's provenance
    records = {r["arm"]: r for r in job_records(sweep)}
    chosen = records["gepa"]["provenance"]["controls_built"]
    assert [key.split("[")[0] for key in chosen] == ["GEPAPrompt"] and next(iter(chosen.values()))["chosen"]

    # the same arms again into a new sweep (a new save_dir): every artifact comes from the cache
    for path in (tmp_path / "outputs").iterdir():
        path.rename(tmp_path / f"first-{path.name}")
    code, out, err = run_main("--multirun", "model=tiny", search, f"arm={','.join(names)}", *SMALL)
    assert code == 0, err[-3000:]
    assert _cache_entries(cache) == built
    again = {(r["arm"], r["config_id"]) for r in job_records(sweep_dir(tmp_path))}
    assert again == {(arm, ids[arm]) for arm in names}
