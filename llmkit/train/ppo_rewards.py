"""The rewards of a `llmkit ppo` run: the reward functions its `reward` setting names
(`llmkit.rewards.plugins`), loaded before anything else so a missing file or function exits 2 at
once; the Python files they come from as inputs of the run (editing one makes it stale); the
reward model when the reward or a separate value trunk reads it; the scorer of its rollouts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmkit.checkpoints.loading import load_reward_model, load_tokenizer, starting_weights
from llmkit.core.workspace import Artifact
from llmkit.data.ingest import file_fingerprint
from llmkit.data.input_files import FILE_STAGE
from llmkit.errors import UserError
from llmkit.rewards.plugins import RewardFunction, RewardScorer, RewardSetup, load_reward_functions, reward_setup
from llmkit.tokenizers.sentencepiece import same_tokenizer


@dataclass
class RunRewards:
    setup: RewardSetup  # the names, their weights, what the stats call them
    functions: list[RewardFunction]
    files: list[Artifact]  # the user files the functions come from
    rm_art: Artifact | None  # the reward model run (--reward), its step folder
    rm_step: Path | None

    def scorer(self, cfg, tokenizer, policy_art) -> tuple[RewardScorer, object]:
        """(the rollouts' scorer, the reward model or None)."""
        reward_model = reward_model_for(self.rm_step, self.setup, cfg, tokenizer, self.rm_art, policy_art)
        return RewardScorer(self.functions, self.setup.weights, reward_model), reward_model


def run_rewards(ctx, cfg, reward_model: str | None) -> RunRewards:
    """The rewards of a run of `cfg` (a PpoConfig) with the reward model run `reward_model`."""
    rm_art, rm_step = starting_weights(ctx.workspace, reward_model) if reward_model else (None, None)
    setup = reward_setup(cfg, rm_art is not None)
    functions = load_reward_functions(setup.names, format_pattern=cfg.reward_format,
                                      partial_credit=cfg.partial_credit)
    files = [Artifact(f, {"fingerprint": file_fingerprint(f), "stage": FILE_STAGE}) for f in setup.files]
    return RunRewards(setup, functions, files, rm_art, rm_step)


def reward_model_for(rm_step, rewards: RewardSetup, cfg, tokenizer, rm_art, policy_art):
    """The reward model when the reward or a separate value trunk reads it, else None; it must
    read the policy's tokens."""
    if rm_step is None or (not rewards.needs_model and cfg.value_model != "separate"):
        return None
    reward_model = load_reward_model(rm_step)
    if not same_tokenizer(tokenizer.path, load_tokenizer(rm_step).path):
        raise UserError(f"{rm_art.path} and {policy_art.path} use different tokenizers; train "
                        "the reward model from the same base as the policy")
    return reward_model
