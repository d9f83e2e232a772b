"""Smoke sweeps of the newest controls through the app: every control's arm beside the baseline, one sweep per model.

On SmolLM2: DirectionalAblation (its shipped arm fits the direction from contrastive pairs), LoRAAdapter (a random
adapter of SmolLM2 built here: nothing ships offline), ConstrainedDecoding (a fixed choice list) and ThinkingBudget (a
thinking cap the driver opens and closes). On the tiny model, where a second model is needed: ContrastiveDecoding (a
tiny amateur of another seed and width) and RewardGuidedDecoding (the tiny reward model, the tiny tokenizer). The
arms without a shipped one come from a search path, as a user's would. Each arm must change some completion against
the baseline's, and the results table must name every arm with its config id.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from app_helpers import SMALL, check_arms_beside_baseline, sweep_dir, write_arms

AMATEUR = "steer_hydra:tiny?seed=1&hidden_size=32"
CHOICES = ["yes", "no", "maybe"]


def _sweep(run_main, tmp_path: Path, model: str, search: str, arms: list[str]) -> pd.DataFrame:
    """Run the baseline and `arms` as one sweep and check it (`check_arms_beside_baseline`, and the printed table's
    baseline row and every arm's share of changed completions); returns the sweep's samples."""
    code, out, err = run_main("--multirun", f"model={model}", search, f"arm=baseline,{','.join(arms)}", *SMALL)
    assert code == 0, err[-3000:]
    sweep = sweep_dir(tmp_path)
    ids, table = check_arms_beside_baseline(sweep, arms, out)
    assert ids["baseline"] == "baseline" and " baseline " in out
    for arm in arms:
        assert table.loc[table["arm"] == arm, "changed"].max() > 0, arm
    return pd.read_csv(sweep / "aggregate" / "samples.csv")


@pytest.mark.slow
def test_state_structural_and_output_controls_on_smollm2_change_completions(run_main, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from steer_hydra.models import resolve_model_reference

    adapter = tmp_path / "adapter"
    model = AutoModelForCausalLM.from_pretrained(resolve_model_reference("steer_hydra:smollm2"))
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(adapter))
    del model
    search = write_arms(
        tmp_path,
        {
            "lora": f"defaults:\n  - /control@controls.lora: lora_adapter\ncontrols:\n  lora: {{adapter: '{adapter}'}}",
            "constrained": f"defaults:\n  - /control@controls.cd: constrained_decoding\n"
            f"controls:\n  cd: {{choices: {CHOICES}}}",
            "thinking": "defaults:\n  - /control@controls.tb: thinking_budget\n"
            "controls:\n  tb: {max_thinking_tokens: 3}",
        },
    )
    arms = ["directional_ablation", "lora", "constrained", "thinking"]
    samples = _sweep(run_main, tmp_path, "smollm2", search, arms)
    assert set(samples.loc[samples["arm"] == "constrained", "completion"]) <= set(CHOICES)  # one of the choices


@pytest.mark.slow
def test_output_controls_with_a_second_model_on_tiny_change_completions(run_main, tmp_path):
    search = write_arms(
        tmp_path,
        {
            "contrastive": f"defaults:\n  - /control@controls.cd: contrastive_decoding\n"
            f"controls:\n  cd: {{amateur: '{AMATEUR}'}}",
            "rad": "defaults:\n  - /control@controls.rad: reward_guided_decoding\n"
            "controls:\n  rad: {reward_model: 'steer_hydra:tiny-reward'}",
        },
    )
    _sweep(run_main, tmp_path, "tiny", search, ["contrastive", "rad"])
