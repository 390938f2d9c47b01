"""QLoRA and friends (`lora.quant`, `lora.use_dora`, `lora.use_rslora`, `lora.target=attention`,
`optim=adamw8bit`): the frozen base held in 4/8 bits by bitsandbytes in every trainer, each
option equal to peft + bitsandbytes used directly (loss and adapter gradients to 1e-5), 8-bit
optimizer states, checkpoints of adapters only that resume bitwise, merges into the dequantised
base, and the dry run's figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from llmkit.checkpoints import step_folders as ckpt
from llmkit.core.config import parse_overrides, resolve_config
from llmkit.errors import ConfigError
from llmkit.checkpoints import lora
from llmkit.model import quant
from llmkit.train.config import TrainConfig
from llmkit.checkpoints.loading import load, load_model
from llmkit.train.metrics import read_metrics
from llmkit.train.sft import SftConfig
from tests.train.posttrain_fixtures import separable_pairs, tiny_model, write_checkpoint_run, write_dataset
from tests.checkpoints.test_lora import (BASE_STEP, FAST, GENERATIVE, LORA, addition_rows, keep_started_model,
                                   logits, train)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def ws(tmp_path, tok):  # test_lora's: a tiny pretrain run, addition chats and separable pairs
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "pretrain", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "sft_train", addition_rows(48))
    write_dataset(ws, "pref_train", separable_pairs(32))
    return ws


def quantized_layers(model) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules() if quant.is_quantized(m)})


# -- the config ---------------------------------------------------------------------------------

def test_the_new_lora_and_optim_keys_resolve_and_validate():
    cfg = resolve_config(SftConfig, {"lora": {"r": 8, "quant": "nf4"}}, parse_overrides(
        ["lora.use_dora=true", "lora.use_rslora=true", "lora.double_quant=false", "lora.target=attention",
         "optim=adamw8bit"]))
    assert (cfg.lora.quant, cfg.lora.use_dora, cfg.lora.use_rslora, cfg.lora.double_quant) == ("nf4", True, True, False)
    assert cfg.lora.target == "attention" and cfg.optim == "adamw8bit" and cfg.lora.quantized
    assert (SftConfig().lora.quant, SftConfig().optim) == ("none", "adamw")
    for bad, words in ((["lora.quant=nf3"], "lora.quant must be one of none, nf4, fp4, int8"),
                       (["optim=sgd"], "optim must be one of adamw, adamw8bit"),
                       (["lora.r=4", "lora.quant=int8", "lora.use_dora=true"], "lora.use_dora with lora.quant=int8"),
                       (["lora.r=4", "lora.quant=nf4", "zero_stage=3"], "ZeRO-3 cuts every parameter")):
        with pytest.raises(ConfigError, match=words):
            resolve_config(SftConfig, parse_overrides(bad))
    resolve_config(SftConfig, parse_overrides(["lora.quant=nf4", "zero_stage=2"]))  # 0-2 shard the adapters only


def test_the_attention_preset_targets_q_k_v_o(tok):
    model = tiny_model(tok.vocab_size)
    assert lora.target_modules(model, lora.LoraConfig(r=2, target="attention")) == [
        "k_proj", "o_proj", "q_proj", "v_proj"]


def test_a_paged_optimizer_on_cpu_exits_2_naming_it(ws):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    result = CliRunner().invoke(build_app(), ["sft", "--from", "pretrain", "--in", "sft_train", "-w", str(ws),
                                              *[a for p in [*FAST, *GENERATIVE, "optim=paged_adamw8bit"]
                                                for a in ("--set", p)]])
    assert result.exit_code == 2, result.output
    assert "optim=paged_adamw8bit pages its state between GPU and CPU memory" in result.output
    assert "use optim=adamw8bit" in result.output and not any((ws / "sft").glob("step-*/complete"))


def test_dry_run_shows_the_quantised_base_and_refuses_zero3_naming_why(ws):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    def dry_run(*pairs):
        return CliRunner().invoke(build_app(), ["sft", "--from", "pretrain", "--in", "sft_train", "-w", str(ws),
                                                "--dry-run", *[a for p in ["seq_len=64", *pairs] for a in ("--set", p)]])

    plain, qlora = dry_run("lora.r=4"), dry_run("lora.r=4", "lora.quant=nf4", "optim=adamw8bit")
    assert plain.exit_code == 0 and qlora.exit_code == 0, qlora.output
    assert "in nf4:" in qlora.output and "in nf4:" not in plain.output
    refused = dry_run("lora.r=4", "lora.quant=nf4", "zero_stage=3")
    assert refused.exit_code == 2 and "ZeRO-3 cuts every parameter" in refused.output


# -- quantising the base -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["nf4", "fp4", "int8"])
def test_quantised_layers_hold_the_weights_in_few_bytes_and_dequantise_to_them(tok, kind):
    model = tiny_model(tok.vocab_size, hidden_size=128, intermediate_size=384)
    weights = {n: m.weight.detach().clone() for n, m in quant.block_linears(model)}
    assert quant.quantize_linears(model, kind, double_quant=True) == 14
    layers = dict(model.named_modules())
    for name, weight in weights.items():
        assert quant.is_quantized(layers[name]) and not layers[name].weight.requires_grad
        error = (quant.dequantized_weight(layers[name]) - weight).abs().max() / weight.abs().max()
        assert 0 < error < (0.01 if kind == "int8" else 0.2)
    bf16_bytes = 2 * sum(w.numel() for w in weights.values())
    assert quant.frozen_bytes(model)["quantized"] <= (0.6 if kind == "int8" else 0.3) * bf16_bytes


def test_dry_run_prices_the_quantised_base_byte_for_byte(tok):
    from llmkit.dryrun import Shape, quantized_bytes

    for kind, double in (("nf4", True), ("nf4", False), ("fp4", True), ("int8", True)):
        model = tiny_model(tok.vocab_size, hidden_size=64, intermediate_size=192)
        quant.quantize_linears(model, kind, double)
        held, stored = quantized_bytes(Shape.of(model.config), kind, double)
        assert stored == quant.frozen_bytes(model)["quantized"], kind
        assert held == sum(p.numel() for n, p in tiny_model(tok.vocab_size, hidden_size=64,
                           intermediate_size=192).named_parameters() if ".layers." in f".{n}" and n.endswith("proj.weight"))


@pytest.mark.parametrize("tied", [True, False])
def test_quantising_on_load_gives_the_model_quantising_after_the_load_gives(tmp_path, tok, tied):
    """A QLoRA run's start is quantised as its checkpoint is read (no float copy of the whole model
    beside it): the same packed bytes, the same logits, the tie kept, the rest float32."""
    write_checkpoint_run(tmp_path, "base", tiny_model(tok.vocab_size, hidden_size=64, intermediate_size=192,
                                                      tie_embeddings=tied), tok)
    after = load_model(tmp_path / "base")[0]
    quant.quantize_linears(after, "nf4", True, torch.float32)
    on_load = load_model(tmp_path / "base", quantize=quant.on_load(lora.LoraConfig(r=4, quant="nf4"),
                                                                   torch.float32))[0]
    assert quantized_layers(on_load) == ["Linear4bit"] and on_load.is_loaded_in_4bit
    packed = lambda m: [t for l in m.modules() if quant.is_quantized(l) for t in quant.quant_tensors(l)]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(packed(on_load), packed(after), strict=True))
    assert torch.equal(logits(on_load), logits(after))
    assert (on_load.lm_head.weight is on_load.model.embed_tokens.weight) == tied
    assert {p.dtype for p in on_load.parameters() if p.dtype != torch.uint8} == {torch.float32}
    assert load_model(tmp_path / "base", quantize=quant.on_load(lora.LoraConfig(r=4), torch.float32))[0] \
        .model.layers[0].mlp.up_proj.__class__ is torch.nn.Linear  # lora.quant=none: a float base


# -- training: every trainer on a quantised base ------------------------------------------------

def test_sft_on_an_nf4_base_trains_the_adapters_and_loads_merged_into_the_dequantised_base(make_ctx, ws,
                                                                                          monkeypatch):
    import llmkit.train.sft as sft

    started = keep_started_model(monkeypatch, sft)
    train(make_ctx, "sft", "lora.quant=nf4", "save_every=3")
    model = started[0]
    assert quantized_layers(model) == ["Linear4bit"]
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_" in n}
    losses = [r["loss"] for r in read_metrics(ws / "sft")]
    assert losses[-1] < losses[0] - 0.1
    step = ckpt.resolve_step_dir(ws / "sft")
    entry = lora.read_config(step)[lora.LORA_KEY]
    assert (entry["quant"], entry["double_quant"]) == ("nf4", True)
    assert all(".lora_" in n for n in ckpt.read_weights(step / ckpt.ADAPTER_WEIGHTS))
    ds_module = ckpt.safe_torch_load(next((step / ckpt.DEEPSPEED).rglob("*model_states.pt")))["module"]
    assert ds_module and all(".lora_" in n for n in ds_module)  # no packed base in the resume state

    merged, _ = load(ws / "sft")  # plain float layers: the dequantised base with the adapters in it
    assert quantized_layers(merged) == [] and not any(".lora_" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged), logits(model.eval()), atol=1e-5, rtol=0)
    live = lora.merge_adapters(model)  # the trained model merged in memory: the same float model
    assert quantized_layers(live) == []
    torch.testing.assert_close(logits(live), logits(merged), atol=1e-5, rtol=0)
    plain = load_model(ws / "pretrain")[0]
    assert not torch.allclose(logits(merged), logits(plain), atol=1e-3)


@pytest.mark.parametrize("options", [["lora.use_dora=true"], ["lora.use_rslora=true", "lora.quant=fp4"],
                                     ["lora.quant=int8", "lora.target=attention"],
                                     ["lora.quant=nf4", "lora.use_dora=true", "precision=bf16"]])
def test_dora_rslora_and_int8_train_save_in_peft_format_and_load_merged(make_ctx, ws, monkeypatch, options):
    import llmkit.train.sft as sft

    started = keep_started_model(monkeypatch, sft)
    train(make_ctx, "sft", *options)
    model = started[0]
    losses = [r["loss"] for r in read_metrics(ws / "sft")]
    assert losses[-1] < losses[0] - 0.05
    step = ckpt.resolve_step_dir(ws / "sft")
    config = json.loads((step / ckpt.ADAPTER_CONFIG).read_text())
    assert config["use_dora"] == ("lora.use_dora=true" in options)
    assert config["use_rslora"] == ("lora.use_rslora=true" in options)
    saved = ckpt.read_weights(step / ckpt.ADAPTER_WEIGHTS)
    if config["use_dora"]:  # peft's own name of the magnitude: no `.weight`
        assert "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector" in saved
    if "lora.target=attention" in options:
        assert sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
        assert quantized_layers(model) == ["Linear8bitLt"]
    compute = {m.compute_dtype for m in model.modules() if quant.is_quantized(m) and hasattr(m, "compute_dtype")}
    assert compute <= {torch.bfloat16 if "precision=bf16" in options else torch.float32}
    if "precision=bf16" not in options:  # bf16 runs are compared in fp32 after loading
        # in training mode: on CPU bitsandbytes' int8 layers multiply by the dequantised weight
        # there, and quantise the activations too in eval mode
        model.float().train(quantized_layers(model) == ["Linear8bitLt"])
        torch.testing.assert_close(logits(load(ws / "sft")[0]), logits(model), atol=1e-5, rtol=0)
    else:
        assert torch.isfinite(logits(load(ws / "sft")[0])).all()


@pytest.mark.parametrize("stage", ["rm", "dpo"])
def test_rm_and_dpo_train_on_an_nf4_base(make_ctx, ws, monkeypatch, stage):
    import importlib

    module = importlib.import_module(f"llmkit.train.{stage}")
    started = keep_started_model(monkeypatch, module)
    train(make_ctx, stage, "lora.quant=nf4", "max_steps=3", "micro_batch_size=8")
    assert quantized_layers(started[0]) == ["Linear4bit"]
    records = read_metrics(ws / stage)
    if stage == "dpo":  # the reference is the nf4 base itself, adapters disabled: equal at step 1
        assert records[0]["loss"] == pytest.approx(0.6931472, abs=1e-5)
        assert records[-1]["rewards/margins"] > records[0]["rewards/margins"]
    step = ckpt.resolve_step_dir(ws / stage)
    assert lora.read_config(step)[lora.LORA_KEY]["quant"] == "nf4"


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_ppo_and_grpo_train_on_an_nf4_base(make_ctx, ws, tok, monkeypatch, algo):
    import llmkit.train.ppo as ppo
    from llmkit.model.reward_model import RewardModel

    reward_model = RewardModel(tiny_model(tok.vocab_size, seed=1, init_std=0.3))
    write_checkpoint_run(ws, "rm", reward_model, tok, config=reward_model.checkpoint_config())
    write_dataset(ws, "prompts_train", [{"id": f"q{i}", "prompt": r["prompt"], "answer": r["answer"]}
                                        for i, r in enumerate(separable_pairs(8))])
    started = keep_started_model(monkeypatch, ppo)
    ctx = make_ctx(inputs=["prompts_train"])
    ctx.overrides = parse_overrides([*LORA, "lora.quant=nf4", "max_steps=2", "prompts_per_rollout=4",
                                     "micro_batch_size=4", "ppo_epochs=1", "max_new_tokens=4", "seq_len=64",
                                     "eval_records=0", "lr=5e-2", "min_lr=5e-2", "group_size=2", f"algo={algo}"])
    ppo.run_ppo(ctx, ctx.config(ppo.PpoConfig, "ppo"), policy="pretrain", reward_model="rm")
    assert quantized_layers(started[0]) == ["Linear4bit"]
    records = read_metrics(ws / "ppo")
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # reference = the nf4 base, adapters off
    assert lora.read_config(ckpt.resolve_step_dir(ws / "ppo"))[lora.LORA_KEY]["quant"] == "nf4"
    load_model(ws / "ppo")


# -- the 8-bit optimizer -----------------------------------------------------------------------

def test_adamw8bit_keeps_8bit_moments_and_skips_a_non_finite_step(tok):
    from llmkit.train.optim import make_optimizer

    def state_bytes(optimizer):
        return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0 and t.numel() > 256)  # moments, not codebooks

    sizes = {}
    for name in ("adamw", "adamw8bit"):
        model = tiny_model(tok.vocab_size, hidden_size=128, intermediate_size=384)  # tensors of 8-bit size
        optimizer = make_optimizer(model, TrainConfig(optim=name, max_steps=1), on_gpu=False, guarded=True)
        model(torch.randint(0, tok.vocab_size, (2, 16))).logsumexp(-1).mean().backward()
        before = model.lm_head.weight.detach().clone()
        optimizer.step()
        assert not torch.equal(model.lm_head.weight, before)
        sizes[name] = state_bytes(optimizer)
        if name == "adamw8bit":
            assert type(optimizer).__mro__[1].__name__ == "AdamW8bit"
            next(model.parameters()).grad[0, 0] = float("nan")
            before = model.lm_head.weight.detach().clone()
            optimizer.step()
            assert optimizer.overflow and torch.equal(model.lm_head.weight, before)
    assert sizes["adamw8bit"] <= 0.3 * sizes["adamw"]


# -- parity with peft + bitsandbytes used directly ----------------------------------------------

PARITY = [("nf4", []), ("nf4", ["use_dora"]), ("fp4", ["use_rslora"]), ("int8", []), ("none", ["use_dora"]),
          ("nf4", ["double_quant_off"])]


@pytest.mark.parametrize("kind,flags", PARITY)
def test_loss_and_adapter_gradients_equal_peft_on_a_transformers_bitsandbytes_model(ws, tmp_path, kind, flags):
    """The same weights exported to transformers and loaded with BitsAndBytesConfig (nf4/fp4/int8),
    peft's adapters on it holding our values: the packed weights are the same bytes, and the loss
    and every adapter gradient equal ours to 1e-5."""
    import peft
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from llmkit.hf.export import ExportConfig, export_hf

    double = "double_quant_off" not in flags
    cfg = lora.LoraConfig(r=4, alpha=8, quant=kind, double_quant=double, use_dora="use_dora" in flags,
                          use_rslora="use_rslora" in flags)
    ours = load_model(ws / "pretrain")[0].train()
    targets = lora.target_modules(ours, cfg)
    lora.add_adapters(ours, cfg, ws / "pretrain" / BASE_STEP, compute_dtype=torch.float32)
    with torch.no_grad():  # B = 0 at the start would leave A without a gradient
        for name, p in ours.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    export_hf(ws / "pretrain" / BASE_STEP, tmp_path / "hf", ExportConfig(probe=False))
    bnb_config = {"nf4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                            bnb_4bit_use_double_quant=double, bnb_4bit_compute_dtype=torch.float32),
                  "fp4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4",
                                            bnb_4bit_use_double_quant=double, bnb_4bit_compute_dtype=torch.float32),
                  "int8": BitsAndBytesConfig(load_in_8bit=True), "none": None}[kind]
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", quantization_config=bnb_config,
                                                  device_map="cpu", dtype=torch.float32)
    theirs = peft.get_peft_model(theirs, peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets,
        use_dora=cfg.use_dora, use_rslora=cfg.use_rslora)).train()
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if ".lora_" in name:
                p.copy_(mine[name.removeprefix(lora.PEFT_PREFIX)])
    if kind in quant.FOUR_BIT:  # bitsandbytes quantised both the same way
        theirs_q = theirs.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
        assert torch.equal(ours.model.layers[0].self_attn.q_proj.base_layer.weight.data, theirs_q.data)

    ids = torch.randint(0, ours.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))

    def loss_of(logits):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    our_loss, their_loss = loss_of(ours(ids)), loss_of(theirs(input_ids=ids).logits)
    our_loss.backward()
    their_loss.backward()
    torch.testing.assert_close(our_loss, their_loss, atol=1e-5, rtol=0)
    grads = {n.removeprefix(lora.PEFT_PREFIX): p.grad for n, p in theirs.named_parameters() if ".lora_" in n}
    assert grads.keys() == {n for n in mine if ".lora_" in n}
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(mine[name].grad, grad, atol=1e-5, rtol=0, msg=name)


# -- resume --------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("options", [["lora.quant=nf4", "optim=adamw8bit", "lora.r=64"]])
def test_a_killed_qlora_or_8bit_run_resumes_bitwise(ws, options):
    """SIGKILL while the second checkpoint is written (step 4 of 6): the rerun resumes from step 2
    and logs the losses and grad norms, and ends on the weights (adapters), of a run never stopped.
    lora.r=64 makes the adapters large enough for 8-bit moments (bitsandbytes keeps tensors under
    4,096 elements in 32 bits). One case holds both the nf4 base and the 8-bit moments: each
    kill-and-resume costs three cold processes (nf4 + DoRA and 8-bit full fine-tuning resumed the
    same way when this was written, 408 s for the three)."""
    def sft(out: str, kill_at: str | None = None) -> int:
        sets = [a for p in [*FAST, *GENERATIVE, *LORA, "save_every=2", "lora.dropout=0.1", *options]
                for a in ("--set", p)]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LLMKIT_KILL_AT")}
        env.update(OMP_NUM_THREADS="1", **({"LLMKIT_KILL_AT": kill_at} if kill_at else {}))
        return subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()", "sft",
                               "--from", "pretrain", "--in", "sft_train", "--out", out, "-w", str(ws),
                               *sets], env=env, capture_output=True, text=True, timeout=600).returncode

    assert sft("straight") == 0
    assert sft("killed", kill_at="checkpoint@2") == -9
    assert ckpt.read_latest(ws / "killed") == "step-00000002"
    assert sft("killed") == 0
    curve = lambda run: [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(ws / run)]  # noqa: E731
    assert curve("killed") == curve("straight") and len(curve("straight")) == 6
    files = ckpt.ADAPTER_WEIGHTS if "lora.r=0" not in options else ckpt.WEIGHTS
    a, b = (ckpt.read_weights(ws / run / "step-00000006" / files) for run in ("killed", "straight"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


ALLOCATOR_PROBE = """
import ctypes, json, sys
from llmkit.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    assert not e.code, e.code
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.free(libc.malloc(24 << 20))  # glibc's own threshold would now rise to 24 MiB
block = libc.malloc(16 << 20)  # larger than any free chunk of the heap: new memory either way
heap = [[int(x, 16) for x in line.split()[0].split("-")] for line in open("/proc/self/maps")
        if line.rstrip().endswith("[heap]")]
print(json.dumps(any(start <= block < end for start, end in heap)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
@pytest.mark.parametrize("quant_kind", ["nf4", "none"])
def test_a_quantised_run_gives_large_allocations_pages_of_their_own(ws, quant_kind):
    """After a QLoRA run a 16 MiB block is mapped on its own (freed, it leaves the process), even
    once a 24 MiB one was freed; after a float-base LoRA run glibc keeps its default (the threshold
    rises to the largest block freed) and the block comes from the heap, where the weights each
    QLoRA step dequantises and frees used to stay resident."""
    sets = [a for p in [*FAST, *GENERATIVE, *LORA, "max_steps=1", f"lora.quant={quant_kind}"] for a in ("--set", p)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MALLOC_MMAP_THRESHOLD_")}
    done = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE, "sft", "--from", "pretrain", "--in", "sft_train",
                           "-w", str(ws), *sets], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) is (quant_kind == "none")
