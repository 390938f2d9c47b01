"""LoRA through peft (`llmkit.checkpoints.lora`): only the adapters (and a new head) train, the base
stays bitwise as it was, checkpoints hold the adapters in peft's format and name their base,
DPO's reference is the policy with its adapters off, and loading / export merge them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmkit.core.config import parse_overrides, resolve_config
from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints import step_folders as ckpt
from llmkit.checkpoints import lora
from llmkit.checkpoints.loading import load, load_model, load_reward_model, merged_copy
from llmkit.train.metrics import read_metrics
from llmkit.train.sft import SftConfig, run_sft
from tests.train.posttrain_fixtures import (addition_rows, separable_pairs, tiny_model,
                                            write_checkpoint_run, write_dataset)

BASE_STEP = "step-00000001"
LORA = ["lora.r=4", "lora.alpha=8"]
FAST = ["max_steps=6", "micro_batch_size=4", "lr=5e-2", "min_lr=5e-3", "warmup_steps=1", "seq_len=64",
        "log_every=1", "eval_every=0"]
GENERATIVE = ["eval_records=0", "max_new_tokens=4"]  # sft and dpo: no exact-match scoring


@pytest.fixture
def ws(tmp_path, tok):
    ws = tmp_path / "ws"
    write_checkpoint_run(ws, "pretrain", tiny_model(tok.vocab_size), tok)
    write_dataset(ws, "sft_train", addition_rows(48))
    write_dataset(ws, "pref_train", separable_pairs(32))
    return ws


def settings(stage: str, *pairs: str) -> dict:
    return parse_overrides([*FAST, *LORA, *(GENERATIVE if stage != "rm" else []), *pairs])


def train(make_ctx, stage: str, *pairs: str, out: str | None = None, base: str = "pretrain"):
    """Run `stage` (sft | rm | dpo) in this process with LoRA and FAST settings; its builder."""
    from llmkit.train.dpo import DpoConfig, run_dpo
    from llmkit.train.rm import RmConfig, run_rm

    cls, run, data = {"sft": (SftConfig, run_sft, "sft_train"), "rm": (RmConfig, run_rm, "pref_train"),
                      "dpo": (DpoConfig, run_dpo, "pref_train")}[stage]
    ctx = make_ctx(inputs=[data], out=out or stage)
    ctx.overrides = settings(stage, *pairs)
    return run(ctx, ctx.config(cls, stage), base=base)


def keep_started_model(monkeypatch, module) -> list:
    """The models `module.load_start` hands its stage (the ones that train), as they load."""
    started = []

    def load_start(*args):
        model, tokenizer = original(*args)
        started.append(model)
        return model, tokenizer

    original = module.load_start
    monkeypatch.setattr(module, "load_start", load_start)
    return started


def frozen_weights_unchanged(model, base_file: Path) -> bool:
    base = ckpt.read_weights(base_file)
    trained = {n.replace(".base_layer", ""): p for n, p in model.state_dict().items() if ".lora_" not in n}
    return all(torch.equal(trained[name].cpu(), base[name]) for name in base)


def logits(model, seed: int = 0):
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out


# -- the config ---------------------------------------------------------------------------------

def test_lora_section_resolves_from_set_and_validates():
    cfg = resolve_config(SftConfig, {"lora": {"r": 16}}, parse_overrides(
        ["lora.alpha=32", "lora.dropout=0.05", "lora.target=q_proj, k_proj,v_proj"]))
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (16, 32.0, 0.05)
    assert cfg.lora.target == ["q_proj", "k_proj", "v_proj"] and cfg.lora.enabled
    assert resolve_config(SftConfig, {"lora": {"target": ["o_proj"]}}).lora.target == ["o_proj"]
    assert SftConfig().lora.target == "all-linear" and not SftConfig().lora.enabled  # off by default
    for bad, key in ((["lora.r=-1"], "lora.r"), (["lora.alpha=0"], "lora.alpha"),
                     (["lora.dropout=1"], "lora.dropout"), (["lora.target=q-proj"], "lora.target"),
                     (["lora.rank=4"], "lora.r"), (["lora.base_products=fp16"], "lora.base_products"),
                     (["lora.r=4", "lora.quant=nf4", "lora.base_products=bf16"], "lora.base_products"),
                     (["lora.r=4", "lora.base_products=bf16", "precision=bf16"], "lora.base_products")):
        with pytest.raises(ConfigError, match=key):
            resolve_config(SftConfig, parse_overrides(bad))


def test_unknown_target_exits_2_naming_the_linear_layers_that_exist(ws, tok):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    model = tiny_model(tok.vocab_size)
    assert lora.target_modules(model, lora.LoraConfig(r=2)) == [
        "down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    result = CliRunner().invoke(build_app(), ["sft", "--from", "pretrain", "--in", "sft_train", "-w", str(ws),
                                              "--set", "seq_len=64", "--set", "lora.r=4",
                                              "--set", "lora.target=q_proj,qkv"])
    assert result.exit_code == 2, result.output
    assert "no linear layer 'qkv'" in result.output and "down_proj, gate_proj, k_proj, o_proj" in result.output
    assert not any((ws / "sft").glob("step-*"))  # refused before training


def test_peft_is_imported_only_when_lora_is_asked_for(ws):
    """The trainers, loading and export import peft (and with it transformers) only for LoRA."""
    script = ("import sys\n"
              "import llmkit.cli.app, llmkit.train.sft, llmkit.train.rm, llmkit.train.dpo, llmkit.train.ppo\n"
              "import llmkit.train.pretrain, llmkit.hf.export\n"
              "from llmkit.checkpoints.loading import load\n"
              f"load({str(ws / 'pretrain')!r})\n"
              "print(sorted(m for m in ('peft', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# -- sft ----------------------------------------------------------------------------------------

def test_sft_with_lora_trains_only_the_adapters(make_ctx, ws, monkeypatch):
    import llmkit.train.sft as sft

    started = keep_started_model(monkeypatch, sft)
    b = train(make_ctx, "sft", "save_every=2", "keep_last=2")
    model = started[0]
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_" in n}
    assert frozen_weights_unchanged(model, ws / "pretrain" / BASE_STEP / ckpt.WEIGHTS)
    assert all(p.abs().sum() > 0 for n, p in model.named_parameters() if ".lora_B." in n)  # zero at the start
    losses = [r["loss"] for r in read_metrics(ws / "sft")]
    assert losses[-1] < losses[0] - 0.1  # a frozen random base: little to learn, but it is learnt
    # r x (in + out) per adapted layer: q, k, v, o, gate, up, down of 2 blocks (hidden 32, kv 16, mlp 64)
    assert b.stats["trainable_parameters"] == 4 * 2 * (64 + 48 + 48 + 64 + 96 + 96 + 96)
    assert 0 < b.stats["trainable_share"] < 0.2

    # checkpoints: the adapters in peft's format and the base they adapt; keep_last and latest as ever
    assert [p.name for p in ckpt.step_dirs(ws / "sft")] == ["step-00000004", "step-00000006"]
    step = ws / "sft" / ckpt.read_latest(ws / "sft")
    assert step.name == "step-00000006" and ckpt.is_complete(step) and not (step / ckpt.WEIGHTS).exists()
    names = set(ckpt.read_weights(step / ckpt.ADAPTER_WEIGHTS))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert all(".lora_" in n for n in names)
    adapter_config = json.loads((step / ckpt.ADAPTER_CONFIG).read_text())
    assert adapter_config["peft_type"] == "LORA" and adapter_config["r"] == 4
    assert adapter_config["task_type"] == "CAUSAL_LM"
    base = json.loads((step / ckpt.MODEL_CONFIG).read_text())["llmkit_lora"]
    assert base == {"base": f"../{lora.PINNED_BASE}",
                    "base_fingerprint": lora.weights_fingerprint(ws / "pretrain" / BASE_STEP)}
    pinned = ws / "sft" / lora.PINNED_BASE  # hard links: no second copy of the base on disk
    assert (pinned / ckpt.WEIGHTS).stat().st_ino == (ws / "pretrain" / BASE_STEP / ckpt.WEIGHTS).stat().st_ino
    ds_module = ckpt.safe_torch_load(next((step / ckpt.DEEPSPEED).rglob("*model_states.pt")))["module"]
    assert ds_module and all(".lora_" in n for n in ds_module)  # no frozen weights in the resume state

    # loading merges the adapters: the trained model's logits, from a plain Transformer
    merged, tokenizer = load(ws / "sft")
    assert not any(".lora_" in n for n, _ in merged.named_parameters()) and merged.trained_on_chats
    unmerged = lora.load_adapters(load_model(ws / "pretrain")[0], step, merge=False)
    torch.testing.assert_close(logits(merged), logits(unmerged), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(merged), logits(model.eval()), atol=1e-5, rtol=0)
    assert train(make_ctx, "sft", "save_every=2", "keep_last=2").up_to_date


def test_generate_and_eval_read_a_lora_run(make_ctx, ws, monkeypatch):
    import llmkit
    import llmkit.train.sft as sft
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    started = keep_started_model(monkeypatch, sft)
    train(make_ctx, "sft", "max_steps=3")
    trained, tokenizer = started[0].eval(), load(ws / "sft")[1]
    trained.trained_on_chats = True  # as load marks an sft run: generate renders the chat template
    expected = llmkit.generate(trained, tokenizer, ["What is 12+34?"], greedy=True, max_new_tokens=4)
    cli = CliRunner()
    done = cli.invoke(build_app(), ["generate", "-w", str(ws), "--from", "sft", "--prompt", "What is 12+34?",
                                    "--set", "greedy=true", "--set", "max_new_tokens=4"])
    assert done.exit_code == 0, done.output
    assert done.stdout == f">>> What is 12+34?\n{expected[0]}\n\n"
    eval_file = Path(__file__).resolve().parents[2] / "recipes/demo/data/eval/generation_en.jsonl"
    done = cli.invoke(build_app(), ["eval", "-w", str(ws), "--from", "sft", "--set", "tasks=generation",
                                    "--set", f"generation.files={eval_file}", "--set", "generation.max_examples=2",
                                    "--set", "generation.max_new_tokens=4"])
    assert done.exit_code == 0, done.output
    assert json.loads((ws / "eval" / "sft" / "results.json").read_text())["generation"]


def test_a_pinned_base_that_changed_is_refused(make_ctx, ws, tok):
    train(make_ctx, "sft", "max_steps=2")
    base_step = ws / "sft" / lora.PINNED_BASE
    (base_step / ckpt.WEIGHTS).unlink()  # a hard link: replaced, not written through
    other = tiny_model(tok.vocab_size, seed=7).state_dict(keep_vars=True)
    ckpt.save_weights(base_step / ckpt.WEIGHTS, {k: v.detach() for k, v in other.items()},
                      ckpt.tied_groups(other))
    with pytest.raises(UserError, match="trained on other weights"):
        load_model(ws / "sft")
    with pytest.raises(UserError, match="trained on other weights"):  # nor is the run continued
        train(make_ctx, "sft", "max_steps=4")


def test_the_base_is_pinned_when_its_run_moves_on_or_starts_over(make_ctx, ws, tok, capsys):
    """A LoRA run keeps its base (hard links in RUN/base/) when the base run is extended with
    keep_last=1 (pruning the step the adapters were trained on) or retrained with --force: it
    still loads, generates, exports and continues — on the weights it was trained on."""
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app
    from llmkit.status import artifact_status

    full = ("lora.r=0", "save_every=2", "keep_last=1")
    train(make_ctx, "sft", "max_steps=2", *full, out="base")
    train(make_ctx, "sft", "max_steps=2", out="adapted", base="base")
    trained = logits(load_model(ws / "adapted")[0])
    train(make_ctx, "sft", "max_steps=4", *full, out="base")
    assert not (ws / "base" / "step-00000002").exists()  # pruned: the adapters' base step is gone
    assert artifact_status(ws / "adapted", ws).state == "done"  # it holds its base
    torch.testing.assert_close(logits(load_model(ws / "adapted")[0]), trained, rtol=0, atol=0)
    cli = CliRunner()
    questions = Path(__file__).resolve().parents[2] / "recipes/demo/data/eval/generation_en.jsonl"
    for args in (["generate", "--from", "adapted", "--prompt", "1+1", "--set", "max_new_tokens=2"],
                 ["eval", "--from", "adapted", "--set", "tasks=generation", "--set", f"generation.files={questions}",
                  "--set", "generation.max_examples=2", "--set", "generation.max_new_tokens=2"],
                 ["export", "--from", "adapted", "--out", "export/adapted"]):
        done = cli.invoke(build_app(), [args[0], "-w", str(ws), *args[1:]])
        assert done.exit_code == 0, done.output

    capsys.readouterr()
    train(make_ctx, "sft", "max_steps=4", out="adapted", base="base")  # continued on its pin
    assert "continuing on its pinned base" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(ws / "adapted") if "loss" in r][-2:] == [3, 4]
    step = ckpt.resolve_step_dir(ws / "adapted")
    assert lora.base_of(step) == ws / "adapted" / lora.PINNED_BASE
    assert lora.weights_fingerprint(lora.base_of(step)) == lora.read_config(step)[lora.LORA_KEY]["base_fingerprint"]

    before = logits(load_model(ws / "adapted")[0])
    make_ctx_force = lambda **kw: make_ctx(force=True, **kw)  # noqa: E731
    train(make_ctx_force, "sft", "max_steps=2", "seed=3", *full, out="base")  # started over
    torch.testing.assert_close(logits(load_model(ws / "adapted")[0]), before, rtol=0, atol=0)


def test_an_artifact_of_another_stage_is_never_replaced_without_force(make_ctx, ws):
    from typer.testing import CliRunner

    from llmkit.cli.app import build_app

    train(make_ctx, "sft", "max_steps=2", "lora.r=0")
    cli = CliRunner()
    data = Path(__file__).resolve().parents[2] / "recipes/demo/data/tasks/sft_train.jsonl"
    done = cli.invoke(build_app(), ["ingest", "-w", str(ws), str(data), "--kind", "sft", "--out", "sft"])
    assert done.exit_code == 2 and "built by `llmkit sft`" in done.output and "--force" in done.output
    assert ckpt.is_complete(ws / "sft" / "step-00000002")
    with pytest.raises(UserError, match="built by `llmkit ingest`"):  # a run over a dataset
        train(make_ctx, "sft", "max_steps=2", "lora.r=0", out="pref_train")
    assert (ws / "pref_train" / "part-00000.parquet").is_file()
    done = cli.invoke(build_app(), ["ingest", "-w", str(ws), str(data), "--kind", "sft", "--out", "sft",
                                    "--force"])
    assert done.exit_code == 0, done.output
    assert not (ws / "sft" / "step-00000002").exists()


def test_zero3_lora_trains_like_zero0(make_ctx, ws):
    curves = {}
    for stage in (0, 3):
        train(make_ctx, "sft", "max_steps=2", "grad_accum=2", "warmup_steps=0", f"zero_stage={stage}",
              out=f"z{stage}")
        curves[stage] = read_metrics(ws / f"z{stage}")
    assert curves[3][0]["grad_norm"] == pytest.approx(curves[0][0]["grad_norm"], rel=1e-5)
    assert curves[3][1]["loss"] == pytest.approx(curves[0][1]["loss"], rel=1e-5)
    a, b = (ckpt.read_weights(ws / f"z{s}" / "step-00000002" / ckpt.ADAPTER_WEIGHTS) for s in (0, 3))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.slow
def test_a_killed_lora_run_resumes_to_the_same_losses(ws, tmp_path):
    """SIGKILL while the second checkpoint is written (step 4 of 6, unsealed): the rerun resumes
    from step 2 and logs the losses, and ends on the adapters, of a run never stopped."""
    def sft(out: str, kill_at: str | None = None) -> int:
        sets = [a for p in [*FAST, *GENERATIVE, *LORA, "save_every=2", "lora.dropout=0.1"]
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
    a, b = (ckpt.read_weights(ws / run / "step-00000006" / ckpt.ADAPTER_WEIGHTS) for run in ("killed", "straight"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_continued_pretraining_with_lora_trains_adapters_of_its_from_checkpoint(tmp_path):
    from tests.train.test_pretrain import pretrain, token_workspace

    ws = token_workspace(tmp_path)
    short = ["max_steps=2", "warmup_steps=1", "eval_every=0"]
    result = pretrain(ws, *short, *LORA, expect=2)
    assert "start from a checkpoint (--from)" in result.output
    pretrain(ws, *short)
    pretrain(ws, *short, *LORA, extra=["--from", "pretrain", "--out", "more"])
    step = ckpt.resolve_step_dir(ws / "more")
    assert (step / ckpt.ADAPTER_WEIGHTS).is_file() and not (step / ckpt.WEIGHTS).exists()
    assert lora.base_of(step) == ws / "more" / lora.PINNED_BASE
    assert lora.weights_fingerprint(lora.base_of(step)) == lora.weights_fingerprint(ws / "pretrain" / "step-00000002")
    merged, _ = load_model(ws / "more")
    base, _ = load_model(ws / "pretrain")
    assert not torch.equal(logits(merged), logits(base))


@pytest.mark.slow
def test_zero3_lora_on_two_processes_equals_zero0_on_one(ws):
    """ZeRO-3 over two processes (gloo) partitions the frozen base and the adapters: the losses
    and the consolidated adapters are those of one process with the same global batch."""
    from tests.train.test_launchers import launch, sets
    from tests.train.test_pretrain import llmkit

    common = [*FAST, *GENERATIVE, *LORA, "max_steps=2", "warmup_steps=0", "micro_batch_size=2"]
    llmkit("sft", "-w", ws, "--from", "pretrain", "--in", "sft_train", "--out", "one",
           *sets(*common, "grad_accum=2"))
    launch("torchrun", "sft", ws, "--from", "pretrain", "--in", "sft_train", "--out", "two",
           *sets(*common, "zero_stage=3"))
    one, two = read_metrics(ws / "one"), read_metrics(ws / "two")
    assert two[0]["grad_norm"] == pytest.approx(one[0]["grad_norm"], rel=1e-5)
    assert two[1]["loss"] == pytest.approx(one[1]["loss"], rel=1e-5)
    a, b = (ckpt.read_weights(ws / run / "step-00000002" / ckpt.ADAPTER_WEIGHTS) for run in ("one", "two"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


# -- rm -----------------------------------------------------------------------------------------

def test_rm_with_lora_trains_the_score_head_in_full(make_ctx, ws, monkeypatch):
    import llmkit.train.rm as rm

    started = keep_started_model(monkeypatch, rm)
    b = train(make_ctx, "rm", "max_steps=4")
    trunk = started[0]
    assert frozen_weights_unchanged(trunk, ws / "pretrain" / BASE_STEP / ckpt.WEIGHTS)
    step = ws / "rm" / ckpt.read_latest(ws / "rm")
    saved = ckpt.read_weights(step / ckpt.ADAPTER_WEIGHTS)
    assert "base_model.model.score.weight" in saved and all(
        ".lora_" in n for n in saved if n != "base_model.model.score.weight")
    adapter_config = json.loads((step / ckpt.ADAPTER_CONFIG).read_text())
    assert adapter_config["modules_to_save"] == ["score"] and adapter_config["task_type"] == "SEQ_CLS"
    assert b.stats["accuracy"] is not None
    reward_model = load_reward_model(ws / "rm")
    ids = torch.randint(0, trunk.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    unmerged = lora.load_adapters(rm.RewardModel(load_model(ws / "pretrain")[0]), step, merge=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(reward_model(ids), unmerged(ids), atol=1e-5, rtol=0)
    torch.manual_seed(0)  # as run_rm seeds the head's initial weights
    initial_head = rm.RewardModel(tiny_model(trunk.config.vocab_size)).score.weight
    assert not torch.equal(saved["base_model.model.score.weight"], initial_head)


# -- dpo ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("precompute", [False, True])
def test_dpo_with_lora_takes_the_reference_from_the_disabled_adapters(make_ctx, ws, monkeypatch, precompute):
    import llmkit.train.dpo as dpo
    from llmkit.data.preferences import collate_pairs, encode_pair

    copy_anything = dpo.copy.deepcopy

    def copy_no_model(obj, *args):
        assert not isinstance(obj, torch.nn.Module), "a second model was built for the reference"
        return copy_anything(obj, *args)

    def load_no_model(*args, **kwargs):
        raise AssertionError("a second model was loaded for the reference")

    monkeypatch.setattr(dpo.copy, "deepcopy", copy_no_model)
    monkeypatch.setattr(dpo, "load_model", load_no_model)
    started = keep_started_model(monkeypatch, dpo)
    train(make_ctx, "dpo", "max_steps=4", "micro_batch_size=8", f"precompute_ref={precompute}")
    records = read_metrics(ws / "dpo")
    assert records[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy = reference at step 1
    assert records[-1]["rewards/margins"] > records[0]["rewards/margins"]

    policy = started[0].eval()
    tokenizer = load(ws / "pretrain")[1]
    pairs = [encode_pair(tokenizer, row, 64) for row in separable_pairs(4)]
    batch = {k: torch.from_numpy(v) for k, v in collate_pairs(pairs, tokenizer.pad_id).items()}
    base = load_model(ws / "pretrain")[0]
    with lora.adapters_disabled(policy):
        reference = dpo.completion_logps(policy, batch)
    torch.testing.assert_close(reference, dpo.completion_logps(base, batch), atol=1e-5, rtol=0)
    assert not torch.allclose(dpo.completion_logps(policy, batch), reference, atol=1e-3)  # adapters on again


# -- ppo / grpo ---------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_ppo_with_lora_takes_the_kl_reference_from_the_disabled_adapters(make_ctx, ws, tok, monkeypatch,
                                                                          algo):
    import llmkit.train.ppo as ppo
    from llmkit.model.reward_model import RewardModel

    reward_model = RewardModel(tiny_model(tok.vocab_size, seed=1, init_std=0.3))  # scores that differ
    write_checkpoint_run(ws, "rm", reward_model, tok, config=reward_model.checkpoint_config())

    copy_anything = ppo.copy.deepcopy

    def copy_no_model(obj, *args):
        assert not isinstance(obj, torch.nn.Module), "a second model was built for the reference"
        return copy_anything(obj, *args)

    monkeypatch.setattr(ppo.copy, "deepcopy", copy_no_model)
    write_dataset(ws, "prompts_train", [{"id": f"q{i}", "prompt": r["prompt"], "answer": r["answer"]}
                                        for i, r in enumerate(separable_pairs(8))])
    ctx = make_ctx(inputs=["prompts_train"])
    ctx.overrides = parse_overrides([*LORA, "max_steps=2", "prompts_per_rollout=4", "micro_batch_size=4",
                                     "ppo_epochs=1", "max_new_tokens=4", "seq_len=64", "eval_records=0",
                                     "lr=5e-2", "min_lr=5e-2", "group_size=2", f"algo={algo}"])
    b = ppo.run_ppo(ctx, ctx.config(ppo.PpoConfig, "ppo"), policy="pretrain", reward_model="rm")
    records = read_metrics(ws / "ppo")
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first rollout: policy = reference
    # the adapters moved, the reference did not (grpo: both steps use the first rollout; its KL loss)
    moved = records[1]["kl"] if algo == "ppo" else records[1]["kl_loss"]
    assert moved != pytest.approx(0.0, abs=1e-6)
    step = ckpt.resolve_step_dir(ws / "ppo")
    assert all(".lora_" in n for n in ckpt.read_weights(step / ckpt.ADAPTER_WEIGHTS))  # the policy's only
    assert b.stats["trainable_parameters"] < b.stats["trainable_parameters"] / b.stats["trainable_share"]
    load_model(ws / "ppo")


# -- export -------------------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [True, False])
def test_a_merged_copy_computes_what_the_adapters_do_and_shares_every_other_tensor(ws, tied):
    """A plain model for decoding a LoRA policy (a rollout): W + B·A·alpha/r in the adapted layers,
    the embedding, norms and head the policy's own tensors; None where the adapters are not plain LoRA."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = tiny_model(300, tie_embeddings=tied)
    lora.add_adapters(model, resolve_config(lora.LoraConfig, {"r": 4, "alpha": 8}), ws / "pretrain" / BASE_STEP)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))  # adapters that trained
    copy = merged_copy(model)
    assert not any(isinstance(m, BaseTunerLayer) for m in copy.modules()) and not copy.training
    torch.testing.assert_close(logits(copy), logits(model), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(copy), logits(lora.merge_adapters(tiny_model(300, tie_embeddings=tied))))
    assert copy.model.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert copy.model.norm.weight.data_ptr() == model.model.norm.weight.data_ptr()
    assert (copy.lm_head.weight is copy.model.embed_tokens.weight) == tied
    layer = model.model.layers[0].mlp.down_proj
    assert torch.equal(copy.model.layers[0].mlp.down_proj.weight,
                       layer.base_layer.weight + layer.lora_B.default.weight @ layer.lora_A.default.weight * 2)

    dora = tiny_model(300)
    lora.add_adapters(dora, resolve_config(lora.LoraConfig, {"r": 4, "use_dora": True}), ws / "pretrain" / BASE_STEP)
    assert merged_copy(dora) is None and merged_copy(tiny_model(300)) is None


def test_export_merges_by_default_and_writes_peft_adapters_with_merge_false(make_ctx, ws, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from llmkit.hf.export import ExportConfig, export_hf

    train(make_ctx, "sft", "max_steps=3")
    step = ckpt.resolve_step_dir(ws / "sft")
    ours = logits(load(ws / "sft")[0])

    export_hf(step, tmp_path / "merged", ExportConfig(probe=False))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(logits(merged), ours, atol=1e-4, rtol=0)
    assert not (tmp_path / "merged" / "adapter").exists()

    record = export_hf(step, tmp_path / "apart", ExportConfig(probe=False, merge=False))
    assert record["adapters"] == "adapter"
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "apart").eval()
    torch.testing.assert_close(logits(base), logits(load(ws / "pretrain")[0]), atol=1e-4, rtol=0)
    with_adapters = PeftModel.from_pretrained(base, tmp_path / "apart" / "adapter").eval()
    torch.testing.assert_close(logits(with_adapters), ours, atol=1e-4, rtol=0)
