import json

import pytest
import torch

from llmkit.errors import ConfigError
from llmkit.rewards.tools import calculator
from llmkit.train.ppo import PpoConfig, PpoTask
from llmkit.train.actor_critic import build_actor_critic
from llmkit.train.engine import Engine
from llmkit.train.rollouts import rollout_prompts, select_rows
from llmkit.train.tool_rollouts import ToolSetup, sample_tool_responses, tool_accuracy, tool_turn_ids
from tests.train.posttrain_fixtures import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = [{"id": "r0", "prompt": "What is 23*47?", "answer": "1081"},
        {"id": "r1", "prompt": "计算 12*11", "answer": "132"}]


def call(expression, name="calculator"):
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"expression": expression}}) + "</tool_call>"


def scripted(tok, replies_by_turn):
    """A policy whose turn t is replies_by_turn[t] (the same for every conversation), each reply
    followed by the end-of-turn token; records how many turns it was asked for."""
    asked = []

    def sample_turn(contexts, max_new):
        asked.append(len(contexts))
        text = replies_by_turn[min(len(asked) - 1, len(replies_by_turn) - 1)]
        return [tok.encode(text) + [tok.stop_ids[0]] for _ in contexts]

    sample_turn.asked = asked
    return sample_turn


def sample(tok, tools, sample_turn, max_turns=3, timeout=5.0, rows=ROWS, window=256):
    prompts, _ = rollout_prompts(tok, rows, 200, "rows", needs_answer=True)
    setup = ToolSetup(tools, tok, max_turns, timeout)
    return sample_tool_responses(tiny_model(tok.vocab_size, max_seq_len=window), prompts, setup, max_new_tokens=40,
                                 temperature=1.0, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                                 decode=tok.decode, device="cpu", sample_turn=sample_turn)


def test_a_tool_call_is_run_its_result_inserted_and_masked_out(tok):
    policy = scripted(tok, [call("23*47"), "The answer is 1081"])
    samples = sample(tok, {"calculator": calculator}, policy)
    eot = tok.stop_ids[0]
    first, last = tok.encode(call("23*47")) + [eot], tok.encode("The answer is 1081") + [eot]
    # llmkit's own chat format has no tool role: the result is a user turn of <tool_response>
    inserted = [tok.role_ids["user"], *tok.encode("<tool_response>\n1081\n</tool_response>"), eot,
                tok.role_ids["assistant"]]
    assert tool_turn_ids(tok, [{"role": "user", "content": ROWS[0]["prompt"]}], call("23*47"), ["1081"]) == inserted
    P = samples.prompt_len
    row = samples.input_ids[0, P:].tolist()
    n = len(first) + len(inserted) + len(last)
    assert row[:n] == first + inserted + last
    # the loss reads the model's own tokens of both turns, never the tool's
    assert samples.response_mask[0, :n].tolist() == [1] * len(first) + [0] * len(inserted) + [1] * len(last)
    assert samples.attention_mask[0, P:P + n].tolist() == [1] * n  # the policy reads the result
    assert samples.texts == ["The answer is 1081"] * 2 and samples.stopped.tolist() == [True, True]
    assert samples.metrics["tool_calls"] == 1.0 and samples.metrics["tool_errors"] == 0
    assert policy.asked == [2, 2]  # two turns of both conversations


def test_failing_tools_become_error_text_and_the_rollout_goes_on(tok):
    def broken(expression):
        raise RuntimeError("no luck")

    def slow(expression):
        import time
        time.sleep(3)

    replies = [call("1+1", "broken") + call("1+1", "slow") + call("1+1", "missing") + "<tool_call>{oops</tool_call>",
               "I give up"]
    samples = sample(tok, {"broken": broken, "slow": slow}, scripted(tok, replies), timeout=0.2,
                     window=1024)
    text = tok.decode(samples.input_ids[0, samples.prompt_len:][samples.attention_mask[0, samples.prompt_len:].bool()
                                                               & ~samples.response_mask[0].bool()].tolist())
    assert "error: RuntimeError: no luck" in text and "error: timed out after 0.2s" in text
    assert "error: no tool named 'missing'" in text and "error: the tool call is not JSON" in text
    assert samples.texts == ["I give up"] * 2 and samples.metrics["tool_errors"] == 8


def test_max_tool_turns_holds(tok):
    policy = scripted(tok, [call("2*3")])  # calls the tool for ever
    samples = sample(tok, {"calculator": calculator}, policy, max_turns=2)
    assert policy.asked == [2, 2, 2]  # two rounds of tools, then the reply is the answer
    assert samples.metrics["tool_calls"] == 2.0 and samples.metrics["tool_turn_limit"] == 2
    assert samples.texts == [call("2*3")] * 2


def test_the_rollout_and_its_minibatches_keep_the_holes_and_grpo_trains(tok, tmp_path, monkeypatch):
    cfg = PpoConfig(algo="grpo", tools="calculator", prompts_per_rollout=2, group_size=2, ppo_epochs=1,
                    max_new_tokens=8, kl_coef=0.05, max_steps=1, micro_batch_size=2, grad_accum=2,
                    seq_len=256, lr=1e-3, min_lr=1e-3, peak_flops=1e9)
    policy = tiny_model(tok.vocab_size, max_seq_len=256)
    prompts, _ = rollout_prompts(tok, ROWS, 200, "rows", needs_answer=True)
    # + i / 10: rewards that differ within a group even when the script answers every row alike, so
    # that the advantages (and the step) are not 0
    rewards = lambda s: torch.tensor([float("1081" in t or "132" in t) + i / 10  # noqa: E731
                                      for i, t in enumerate(s.texts)])
    task = PpoTask(build_actor_critic(policy, cfg), None, prompts, rewards, cfg, stop_ids=tok.stop_ids,
                   pad_id=tok.pad_id, decode=tok.decode, tools=ToolSetup({"calculator": calculator}, tok))
    rollout = task.make_rollout(task.model)  # sampled by the random model itself: whatever it writes
    assert "tool_calls" in task._rollout_metrics
    script = scripted(tok, [call("23*47"), "1081"])
    monkeypatch.setattr(task, "sample", lambda policy, prompts: sample_tool_responses(
        policy, prompts, task.tools, max_new_tokens=8, temperature=1.0, stop_ids=tok.stop_ids,
        pad_id=tok.pad_id, decode=tok.decode, device="cpu", sample_turn=script))
    rollout = task.make_rollout(task.model)
    batch = select_rows(rollout, torch.arange(2))
    holes = rollout["attention_mask"][:, rollout["prompt_len"]:].bool() & ~rollout["response_mask"].bool()
    assert holes.any() and torch.equal(batch["response_mask"], rollout["response_mask"][:2, :batch["response_mask"].shape[1]])
    assert batch["response_mask"][:, -1].any()  # the final turn is in the minibatch
    before = {k: v.detach().clone() for k, v in task.model.named_parameters()}
    Engine(tmp_path / "run", cfg.train_config(), task).fit()
    assert any(not torch.equal(before[k], v) for k, v in task.model.named_parameters())


def test_tool_accuracy_and_the_settings(tok):
    policy = tiny_model(tok.vocab_size, max_seq_len=256)
    accuracy = tool_accuracy(policy, tok, ROWS, ToolSetup({"calculator": calculator}, tok, 1), 8)
    assert accuracy == 0.0  # a random model states no answer
    with pytest.raises(ConfigError, match="tools"):
        PpoConfig(algo="ppo", tools="calculator")
    with pytest.raises(ConfigError, match="neither a built-in"):
        PpoConfig(algo="grpo", tools="abacus")
