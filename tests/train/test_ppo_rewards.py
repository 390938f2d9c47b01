"""`llmkit ppo` rewarded by reward functions (llmkit.rewards.plugins) end to end: named built-ins
and a TRL-style user file, weighted; the file an input of the run; a response no reward scores
left out of its group's baseline; a missing file or function exits 2 naming it."""

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.errors import ConfigError, UserError
from llmkit.train.ppo_algorithms import add_advantages
from llmkit.train.ppo_config import PpoConfig
from tests.train.test_ppo import run_stage, stage_ws  # noqa: F401 (a fixture)

REWARD_FILE = Path(__file__).parents[1] / "assets" / "trl_style_rewards.py"


def test_grpo_trains_on_named_rewards_and_a_user_file_weighted(make_ctx, stage_ws, tmp_path):  # noqa: F811
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(REWARD_FILE.read_text())
    spec = f"format,verify,{rewards}:brevity,{rewards}:fails_on_sevens"
    b = run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, reward=spec,
                  reward_weights="0.5,1,2,1", eval_records=0)
    assert b.stats["reward"] == spec and b.stats["rollouts"] == 2
    records = [json.loads(line) for line in (stage_ws / "ppo" / "metrics.jsonl").open()]
    for name in ("format", "verify", "my_rewards:brevity", "my_rewards:fails_on_sevens"):
        assert f"reward/{name}" in records[0] and f"reward_none/{name}" in records[0]
    assert records[0]["reward_unscorable"] == 0.0  # brevity scores every response
    # brevity is 1 / (1 + tokens) > 0 and weighs 2: the mean reward is above 0 whatever was said
    assert b.stats["reward_start"] > 0
    manifest = json.loads((stage_ws / "ppo" / "manifest.json").read_text())
    assert any(Path(i["path"]).name == "my_rewards.py" for i in manifest["inputs"])
    assert run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, reward=spec,
                     reward_weights="0.5,1,2,1", eval_records=0).up_to_date
    rewards.write_text(REWARD_FILE.read_text() + "\n# edited\n")  # not what the run was trained with
    with pytest.raises(ConfigError, match=f"other settings \\(input {rewards}\\)"):
        run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, reward=spec,
                  reward_weights="0.5,1,2,1", eval_records=0)


def test_a_prompt_without_an_answer_needs_no_answer_unless_verify_reads_it(make_ctx, stage_ws, tmp_path):  # noqa: F811
    from tests.train.test_ppo import prompt_rows
    from tests.train.posttrain_fixtures import write_dataset

    rows = prompt_rows(4)
    rows[1]["answer"] = None
    write_dataset(stage_ws, "prompts_train", rows)
    b = run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, reward="format",
                  max_steps=1, eval_records=0)
    assert b.stats["reward"] == "format"
    with pytest.raises(UserError, match="has no `answer`"):
        run_stage(make_ctx, algo="grpo", group_size=2, prompts_per_rollout=2, reward="format,verify",
                  max_steps=1, eval_records=0, out="ppo_verify")


def test_an_unscorable_response_leaves_its_groups_baseline_and_gets_no_advantage():
    """GRPO as TRL's: a response whose every reward was None is NaN, out of its group's mean and
    std, advantage 0; PPO leaves it out of the loss (its mask), rewards of the others unchanged."""
    mask = torch.ones(4, 3, dtype=torch.long)
    scores = torch.tensor([1.0, math.nan, 0.0, 3.0])
    rollout = {"response_mask": mask.clone()}
    add_advantages(rollout, PpoConfig(algo="grpo", group_size=2), scores, torch.ones(4, dtype=torch.bool),
                   None, None, None, 0.0)
    std = 4.5 ** 0.5  # of 0 and 3; the lone scored response of the first group has no std: 0
    assert rollout["advantages"][:, 0].tolist() == pytest.approx([0.0, 0.0, -1.5 / (std + 1e-4), 1.5 / (std + 1e-4)])
    ppo = {"response_mask": mask.clone()}
    add_advantages(ppo, PpoConfig(), scores, torch.ones(4, dtype=torch.bool), torch.zeros(4, 3), None,
                   torch.zeros(4, 3), 0.0)
    assert ppo["response_mask"][:, 0].tolist() == [1, 0, 1, 1] and not ppo["advantages"].isnan().any()


def test_a_bad_reward_exits_2_naming_it(stage_ws, tmp_path):  # noqa: F811
    runner, app = CliRunner(), build_app()
    ws = ["-w", str(stage_ws), "--in", "prompts_train"]
    r = runner.invoke(app, ["ppo", *ws, "--set", "algo=grpo", "--set", f"reward=math,{tmp_path}/nowhere.py:score"])
    assert r.exit_code == 2 and "nowhere.py" in r.output, r.output
    r = runner.invoke(app, ["ppo", *ws, "--set", "reward=maths"])
    assert r.exit_code == 2 and "unknown reward 'maths' (did you mean math?)" in r.output, r.output


def test_reward_settings_are_checked_on_construction():
    with pytest.raises(ConfigError, match="reward_format is read by the format reward alone"):
        PpoConfig(reward="verify", reward_format=r"\d+")
    with pytest.raises(ConfigError, match="reward_weights has 1 weights for 2 rewards"):
        PpoConfig(reward="verify,format", reward_weights=[1.0])
