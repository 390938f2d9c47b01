from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.cli.dry_run import DryRun
from llmkit.stages import deferred

plan_ppo = deferred("llmkit.train.ppo:plan_ppo")
run_ppo = deferred("llmkit.train.ppo:run_ppo")


@stage_command(config=True, inputs=True, writes=True)
def ppo(
    ctx,
    from_: Annotated[str, typer.Option(
        "--from", help="Policy checkpoint run (or step folder) to start from, e.g. sft.")] = "sft",
    reward: Annotated[Optional[str], typer.Option(
        "--reward", help="Reward-model run (`llmkit rm`); without it the reward is exact match "
                         "against each prompt's answer.")] = None,
    eval_: Annotated[Optional[str], typer.Option(
        "--eval", help="Held-out prompt dataset for exact match before/after (default: a share "
                       "of --in).")] = None,
    dry_run: DryRun = False,
):
    """PPO / GRPO / RLOO (--set algo=) of a policy on prompts (--in, default prompts_train), rewarded by --reward or exact match -> `ppo`."""
    cfg = ctx.config()
    if dry_run:
        return plan_ppo(ctx, cfg, from_, reward, eval_)
    run_ppo(ctx, cfg, policy=from_, reward_model=reward, eval_data=eval_)
