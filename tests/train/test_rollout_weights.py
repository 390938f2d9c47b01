"""`--set decode.weights=bf16|f16|int8` for PPO/GRPO/RLOO: the rollouts sample through low-precision
copies of the policy's current weights; what scores the samples (old and reference log-probs, the
KL, the losses) and the fp32 default are untouched."""

import copy
import json

import pytest
import torch

import llmkit.model.packed_linear as packed
import llmkit.train.rollouts as rollouts
from llmkit.core.config import parse_overrides, resolve_config
from llmkit.errors import ConfigError
from llmkit.model import cpu_kernels
from llmkit.model.cpu_kernels import Bf16PanelWeight, Int8PanelWeight
from llmkit.model.decode_weights import CONVERTED, DecodeConfig
from llmkit.train.engine import Engine
from llmkit.train.ppo import PpoConfig, run_ppo
from tests.train.test_ppo import stage_ws, tiny_setup  # noqa: F401 (stage_ws: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
KINDS = {"bf16": Bf16PanelWeight, "int8": Int8PanelWeight}


def needs(kind):
    return pytest.mark.skipif(not cpu_kernels.low_precision_available(kind), reason=f"needs the {kind} kernels")


@pytest.fixture
def pack_every_matrix(monkeypatch):
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 1)  # the tiny model's matrices are all below the real bar


def spy_on_rollouts(monkeypatch, layer_of, module=rollouts):
    """Record, at every rollout's generation, the weight `layer_of(policy)` decodes through, the
    weight it holds then, and whether the trainer packed it for training."""
    seen = []

    def generate(policy, *args, **kwargs):
        layer = layer_of(policy)
        decodes = getattr(layer, packed.PACKED_FEW, None) or getattr(layer, packed.PACKED, None)
        seen.append((decodes, layer.weight.detach().clone(), hasattr(layer, packed.PACKED_T)))
        return real(policy, *args, **kwargs)

    real = module.generate
    monkeypatch.setattr(module, "generate", generate)
    return seen


def run_grpo(make_ctx, *settings):
    """`llmkit ppo --set algo=grpo ...` of tests/train/test_ppo's stage workspace, two small steps."""
    base = ["algo=grpo", "group_size=2", "prompts_per_rollout=2", "max_steps=2", "micro_batch_size=4",
            "ppo_epochs=1", "max_new_tokens=4", "seq_len=64", "eval_records=0", "lr=1e-3", "min_lr=1e-3"]
    ctx = make_ctx(inputs=["prompts_train"])
    ctx.overrides = parse_overrides([*base, *settings])
    return run_ppo(ctx, ctx.config(PpoConfig, "ppo"), policy="sft", eval_data="prompts_eval")


def test_decode_weights_is_a_setting_of_ppo():
    assert resolve_config(PpoConfig, {"decode": {"weights": "int8"}}).decode.weights == "int8"
    assert PpoConfig().decode.weights == "fp32"


@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs(k)) for k in KINDS])
def test_every_rollout_samples_through_a_copy_of_the_current_weights(tmp_path, kind, pack_every_matrix,
                                                                    monkeypatch):
    """A full fine-tune changes the policy every step: each rollout converts it again."""
    seen = spy_on_rollouts(monkeypatch, lambda policy: policy.model.layers[0].self_attn.o_proj)
    task, cfg = tiny_setup("grpo", max_steps=4, ppo_epochs=1, decode=DecodeConfig(kind))
    before = {k: v.detach().clone() for k, v in task.model.named_parameters()}
    Engine(tmp_path / "run", cfg.train_config(), task).fit()
    assert all(not torch.equal(before[k], p) for k, p in task.model.named_parameters())  # it trained
    assert len(seen) == task.rollouts_done == 2 and task.rollout_weights == kind
    assert not torch.equal(seen[0][1], seen[-1][1])  # the weights moved between rollouts
    for decodes, weight, _ in seen:
        assert isinstance(decodes, KINDS[kind])
        matrix = decodes.product(torch.eye(weight.shape[1])).t()
        if kind == "bf16":  # widened back to float32 exactly: the weight rounded to bf16, bit for bit
            assert torch.equal(matrix, weight.to(torch.bfloat16).float())
        else:  # q8_0: half a step of its block's scale (max |w| / 127) and that scale's fp16 rounding
            step = weight.abs().reshape(weight.shape[0], -1, 32).amax(-1, keepdim=True) / 127
            assert ((matrix - weight).reshape(step.shape[0], -1, 32).abs() <= (0.5 + 127 * 2 ** -11) * step).all()
    # outside the rollouts nothing decodes through the copy (the log-probs and losses are fp32's)
    layer = task.model.policy.model.layers[0].self_attn.o_proj
    assert not hasattr(layer, packed.PACKED) and "forward" not in vars(layer)


@needs("bf16")
def test_bf16_rollouts_are_the_fp32_rollouts_of_the_weights_rounded_to_bf16(pack_every_matrix):
    """The bf16 product is the fp32 panel kernel's with the weight rounded (tests/model/
    test_decode_weights), so from one seed the sampled tokens are those of a rounded fp32 policy."""
    task, _ = tiny_setup("grpo", decode=DecodeConfig("bf16"))
    rounded = copy.deepcopy(task)
    rounded.cfg = copy.deepcopy(task.cfg)
    rounded.cfg.decode = DecodeConfig()
    with torch.no_grad():
        for name, p in rounded.model.policy.named_parameters():
            if p.dim() == 2 and "embed_tokens" not in name:  # the embedding is looked up, not multiplied
                p.copy_(p.to(torch.bfloat16).float())
    prompts = task._next_prompts()
    torch.manual_seed(3)
    low = task.sample(task.model.policy, prompts)
    torch.manual_seed(3)
    fp32 = rounded.sample(rounded.model.policy, prompts)
    assert (task.rollout_weights, rounded.rollout_weights) == ("bf16", "fp32")
    assert torch.equal(low.input_ids, fp32.input_ids)
    assert low.response_mask.sum() > len(prompts)  # responses of several tokens were compared


@needs("int8")
def test_multi_turn_tool_rollouts_sample_through_the_copy_too(pack_every_matrix, monkeypatch):
    import llmkit.train.tool_rollouts as tool_rollouts

    seen = spy_on_rollouts(monkeypatch, lambda policy: policy.lm_head, module=tool_rollouts)
    task, _ = tiny_setup("grpo", decode=DecodeConfig("int8"))
    task.tools = tool_rollouts.ToolSetup({}, tokenizer=None, max_turns=1)  # a random policy calls no tool
    task.sample(task.model.policy, task._next_prompts())
    assert seen and all(isinstance(decodes, Int8PanelWeight) for decodes, *_ in seen)


def test_the_fp32_default_converts_nothing(tmp_path, pack_every_matrix, monkeypatch):
    seen = spy_on_rollouts(monkeypatch, lambda policy: policy.model.layers[0].self_attn.o_proj)
    task, cfg = tiny_setup("grpo", max_steps=2)
    Engine(tmp_path / "run", cfg.train_config(), task).fit()
    assert seen and all(decodes is None for decodes, *_ in seen)  # generate packs fp32 panels itself, later
    assert task.rollout_weights == "fp32"
    assert not any(CONVERTED in vars(m) for m in task.model.modules())


def test_a_bad_value_is_refused_naming_the_key(make_ctx, stage_ws):
    with pytest.raises(ConfigError, match=r"decode.weights must be one of fp32, bf16, f16, int8, got 'q4'"):
        run_grpo(make_ctx, "decode.weights=q4")


@needs("int8")
def test_a_lora_policy_samples_through_a_merged_copy_converted_at_each_rollout(make_ctx, stage_ws, pack_every_matrix,
                                                                            monkeypatch):
    """llmkit's one-call decoding steps take plain layers: each rollout of a LoRA run samples through
    a plain copy of the policy with its adapters merged (the adapters change every step), in int8."""
    seen = spy_on_rollouts(monkeypatch, lambda policy: policy.model.layers[0].self_attn.o_proj)
    b = run_grpo(make_ctx, "decode.weights=int8", "lora.r=4", "partial_credit=true")  # rewards that differ
    assert len(seen) == 2 and all(isinstance(decodes, Int8PanelWeight) and not packed_for_training
                                  for decodes, _, packed_for_training in seen)
    assert not torch.equal(seen[0][1], seen[1][1])  # the adapters trained in between, merged anew
    for decodes, weight, _ in seen:
        torch.testing.assert_close(decodes.dequantized(), weight, atol=weight.abs().max().item() / 127, rtol=0)
    stats = json.loads((stage_ws / "ppo" / "manifest.json").read_text())["stats"]
    assert stats["rollout_weights"] == b.stats["rollout_weights"] == "int8"


def test_without_memory_for_the_copy_a_lora_policy_samples_through_its_base_converted_once(
        make_ctx, stage_ws, pack_every_matrix, monkeypatch):
    """The trainer packs a LoRA run's frozen base for training; its rollouts then decode through an
    int8 copy of it, made at the first rollout and kept (the base never changes)."""
    monkeypatch.setattr(rollouts, "available_memory", lambda: 0)
    seen = spy_on_rollouts(monkeypatch, lambda policy: policy.model.layers[0].self_attn.o_proj.base_layer)
    b = run_grpo(make_ctx, "decode.weights=int8", "lora.r=4")
    assert len(seen) == 2 and all(isinstance(decodes, Int8PanelWeight) and packed_for_training
                                  for decodes, _, packed_for_training in seen)
    assert seen[0][0] is seen[1][0]  # converted once
    assert b.stats["rollout_weights"] == "int8"
