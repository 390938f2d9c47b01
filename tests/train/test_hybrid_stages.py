"""Every stage on the families of issue 51: a tiny random Qwen3.5 (a Gated DeltaNet layer beside a
gated full-attention one) and a tiny SmolLM3 (a layer without RoPE beside one with it), saved by
transformers' own classes with a byte-level BPE tokenizer and the family's chat template, imported
with `llmkit import`, then: continued pretraining (`pretrain --from`), sft, LoRA / QLoRA (nf4) / DoRA
sft, rm, dpo, kto, ppo and grpo, distill (the hybrid as teacher and as student), generate on
prompts of different lengths, eval (perplexity and an lm-eval task), judge, export to transformers,
extend-vocab, status and report. A Qwen3.5 sft killed by SIGKILL mid-run resumes to the bits of a
run never stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.checkpoints import step_folders as ckpt
from llmkit.cli.app import build_app
from llmkit.train.metrics import read_metrics
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.hf.test_vocab_extend import ENGLISH, chinese
from tests.train.posttrain_fixtures import (addition_rows, preference_rows, separable_pairs,
                                            write_dataset)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py
runner = CliRunner()
LINEAR, FULL = "linear_attention", "full_attention"
SMOLLM3_TEMPLATE = (Path(__file__).parents[1] / "assets" / "smollm3_chat_template.jinja").read_text(encoding="utf-8")
SMOLLM3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
SHAPE = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=512)
FAMILIES = {
    "qwen3_5": lambda vocab: transformers.Qwen3_5TextConfig(
        vocab_size=vocab, **SHAPE, tie_word_embeddings=False, head_dim=16, num_hidden_layers=2, layer_types=[LINEAR, FULL],
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=8,
        linear_conv_kernel_dim=4),
    "smollm3": lambda vocab: transformers.SmolLM3Config(
        vocab_size=vocab, **SHAPE, num_hidden_layers=2, no_rope_layers=[0, 1],  # layer 0 without RoPE
        tie_word_embeddings=True, pad_token_id=None, bos_token_id=None, eos_token_id=None),
}
TINY = ["--set", "warmup_steps=0", "--set", "micro_batch_size=2", "--set", "eval_every=0", "--set", "max_steps=2",
        "--set", "lr=1e-2"]
# SmolLM3's template writes a metadata block (cutoff, date, reasoning mode) into every system turn:
# ~140 tokens of a tokenizer of 800 ids
SEQ_LEN = {"qwen3_5": 64, "smollm3": 192}
GENERATIVE = ["--set", "eval_records=2", "--set", "max_new_tokens=3"]
# in place of the templates' default system turns (SmolLM3's is ~1,000 tokens of a vocabulary of 800)
SYSTEM = [{"role": "system", "content": "Add."}]
DEMO_EVAL = Path(__file__).parents[2] / "recipes/demo/data/eval"


def llmkit_cli(*args) -> str:
    r = runner.invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, f"llmkit {' '.join(map(str, args))}:\n{r.output}"
    return r.output


def with_system(rows: list[dict]) -> list[dict]:
    """Rows with their prompt as a system and a user turn (`messages`, read before `prompt`)."""
    out = []
    for r in rows:
        messages = [*SYSTEM, {"role": "user", "content": r["prompt"] or r["messages"][0]["content"]}]
        if r.get("response") or r.get("messages"):
            messages.append({"role": "assistant", "content": r["answer"]})
        out.append({**r, "messages": messages})
    return out


def save_family(folder: Path, family: str) -> Path:
    template, specials = ((QWEN25_TEMPLATE, QWEN_SPECIALS) if family == "qwen3_5" else
                          (SMOLLM3_TEMPLATE, SMOLLM3_SPECIALS))
    pad = "<|endoftext|>" if family == "qwen3_5" else "<|end_of_text|>"
    backend = train_bpe(specials)
    save_folder(folder, backend, template, eos_token="<|im_end|>", pad_token=pad)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family](backend.get_vocab_size()))
    with torch.no_grad():  # norms and decay rates off their initial values, so that a detail shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def feedback_rows(n: int) -> list[dict]:
    return [{"id": f"{r['id']}-{k}", "prompt": r["prompt"], "completion": c, "label": not k,
             "answer": r["answer"]} for r in separable_pairs(n) for k, c in enumerate((r["chosen"], r["rejected"]))]


@pytest.fixture(scope="module", params=list(FAMILIES))
def pipeline(request, tmp_path_factory):
    """A workspace where the family's model was imported and every stage ran a few steps."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    folder = save_family(root / "hf", family)
    ws = root / "ws"
    tiny = [*TINY, "--set", f"seq_len={SEQ_LEN[family]}"]
    llmkit_cli("import", "--from", folder, "--out", "base", "-w", ws)
    prompts = [{"id": f"q{i}", "prompt": r["prompt"], "answer": r["answer"]} for i, r in
               enumerate(preference_rows(12, seed=1))]
    for name, rows in [("sft", addition_rows(12)), ("pref", preference_rows(12)), ("prompts", prompts),
                       ("feedback", feedback_rows(6))]:
        rows = with_system(rows)
        write_dataset(ws, f"{name}_train", rows[:10])
        write_dataset(ws, f"{name}_eval", rows[10:])
    write_dataset(ws, "corpus", [{"id": f"d{i}", "prompt": f"文档 {i}: the model reads this text. " * 3}
                                 for i in range(16)])
    llmkit_cli("tokenize", "--in", "corpus", "--tokenizer", "base", "-w", ws, "--set", "val_fraction=0")
    llmkit_cli("pretrain", "--from", "base", "--in", "tokens", "--out", "continued", "-w", ws,
               "--set", "max_steps=2", "--set", "warmup_steps=0", "--set", "micro_batch_size=2",
               "--set", "seq_len=32", "--set", "eval_every=0")
    llmkit_cli("sft", "--from", "base", "--eval", "sft_eval", "-w", ws, *tiny, *GENERATIVE)
    for out, options in [("sft_lora", ["lora.r=4"]), ("sft_qlora", ["lora.r=4", "lora.quant=nf4"]),
                         ("sft_dora", ["lora.r=4", "lora.use_dora=true"])]:
        llmkit_cli("sft", "--from", "base", "--in", "sft_train", "--out", out, "-w", ws, *tiny,
                   *[a for o in options for a in ("--set", o)])
    llmkit_cli("rm", "--from", "base", "--eval", "pref_eval", "-w", ws, *tiny)
    llmkit_cli("dpo", "--from", "sft", "--eval", "pref_eval", "-w", ws, *tiny, *GENERATIVE)
    llmkit_cli("kto", "--from", "sft", "--in", "feedback_train", "-w", ws, *tiny)
    for algo in ("grpo", "ppo"):
        llmkit_cli("ppo", "--from", "sft", "--reward", "rm", "--in", "prompts_train", "--out", algo, "-w", ws,
                   "--set", f"algo={algo}", "--set", "prompts_per_rollout=2", *tiny, *GENERATIVE)
    # the hybrid as teacher (sft) and as student (base): one tokenizer, so any two runs of a family
    llmkit_cli("distill", "--teacher", "sft", "--from", "base", "--in", "sft_train", "-w", ws, *tiny)
    llmkit_cli("distill", "--teacher", "sft", "--from", "base", "--in", "sft_train", "--out", "distill_on_policy",
               "-w", ws, *tiny, "--set", "on_policy=1.0", "--set", "max_new_tokens=4")  # the student samples
    return family, folder, ws


def stats(ws: Path, name: str) -> dict:
    return json.loads((ws / name / "manifest.json").read_text())["stats"]


def changed_tensors(ws: Path, before: str, after: str) -> list[str]:
    a, b = llmkit.load(ws / before)[0].state_dict(), llmkit.load(ws / after)[0].state_dict()
    return [k for k in b if not torch.equal(a[k], b[k])]


def test_import_gives_the_familys_layers(pipeline):
    family, folder, ws = pipeline
    model, _ = llmkit.load(ws / "base")
    if family == "qwen3_5":
        assert list(model.config.layer_types) == [LINEAR, FULL]
    else:
        assert list(model.config.nope_layers) == [0] and model.config.tie_embeddings
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-4


@pytest.mark.parametrize("stage, start", [("continued", "base"), ("sft", "base"), ("dpo", "sft"), ("kto", "sft"),
                                          ("grpo", "sft"), ("ppo", "sft"), ("distill", "base"),
                                          ("distill_on_policy", "base")])
def test_every_training_stage_trains_every_tensor_of_the_imported_model(pipeline, stage, start):
    family, _, ws = pipeline
    assert stats(ws, stage)["steps"] == 2
    changed = changed_tensors(ws, start, stage)
    assert len(changed) == len(llmkit.load(ws / stage)[0].state_dict()), family


def test_lora_qlora_and_dora_adapt_every_projection_of_the_family(pipeline):
    """all-linear LoRA puts adapters on the Gated DeltaNet projections (peft's names) as on the
    attention and MLP ones; nf4 holds the frozen base in 4 bits, DoRA adds a magnitude per row."""
    from safetensors.torch import load_file

    family, _, ws = pipeline
    modules = ["self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"]
    if family == "qwen3_5":
        modules += [f"linear_attn.{m}" for m in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")]
    for run in ("sft_lora", "sft_qlora", "sft_dora"):
        step = ckpt.resolve_step_dir(ws / run)
        adapters = load_file(step / ckpt.ADAPTER_WEIGHTS)
        for module in modules:
            b = [v for k, v in adapters.items() if f".{module}.lora_B" in k]
            assert b and all(v.abs().sum() > 0 for v in b), (family, run, module)  # zero before training
        magnitudes = [k for k in adapters if "lora_magnitude_vector" in k]
        assert bool(magnitudes) == (run == "sft_dora"), (family, run)
        assert changed_tensors(ws, "base", run), (family, run)  # loaded merged into the base
    quant = json.loads((ws / "sft_qlora" / "manifest.json").read_text())["config"]["lora"]["quant"]
    assert quant == "nf4"


def test_the_reward_model_trains_on_the_imported_trunk(pipeline):
    from llmkit.checkpoints.loading import load_reward_model

    family, _, ws = pipeline
    assert stats(ws, "rm")["steps"] == 2 and 0.0 <= stats(ws, "rm")["accuracy"] <= 1.0
    trunk, _ = llmkit.load(ws / "base")
    reward_model = load_reward_model(ws / "rm")
    assert not torch.equal(reward_model.model.embed_tokens.weight, trunk.model.embed_tokens.weight), family


def test_left_padded_rollouts_score_as_each_row_alone(pipeline):
    """ppo/grpo score their left-padded rollouts (prompts of different lengths, then the replies)
    with the policy and the reward model: padding must not reach a Gated DeltaNet state or shift a
    position, so each row scores as it does alone."""
    from llmkit.model.decoding import left_pad
    from llmkit.checkpoints.loading import load_reward_model
    from llmkit.train.actor_critic import response_logprobs

    family, _, ws = pipeline
    policy, tokenizer = llmkit.load(ws / "sft")
    reward_model = load_reward_model(ws / "rm")
    prompts = [tokenizer.encode(p) for p in ("What is 1+2?", "计算 11+22 等于多少？ Reverse: abcd dcba " * 3, "Hi")]
    reply = tokenizer.encode(" 3 and then some")
    ids, mask = left_pad(prompts, tokenizer.pad_id)
    ids, mask = torch.cat([ids, torch.tensor([reply] * 3)], 1), torch.cat([mask, torch.ones(3, len(reply), dtype=mask.dtype)], 1)
    with torch.no_grad():
        together = response_logprobs(policy, ids, mask, ids.shape[1] - len(reply))
        rewards = reward_model(ids, mask)
        for row, prompt in enumerate(prompts):
            alone = torch.tensor([prompt + reply])
            ones = torch.ones_like(alone)
            assert (together[row] - response_logprobs(policy, alone, ones, len(prompt))[0]).abs().max() < 1e-4, family
            assert abs(rewards[row] - reward_model(alone, ones)[0]) < 1e-4, family


def test_generate_gives_each_prompt_of_a_batch_its_completion_alone(pipeline, tmp_path):
    """Prompts of different lengths, left-padded into one batch (the recurrent state and the KV
    cache both skip the padding), complete as each does alone."""
    family, _, ws = pipeline
    prompts = ["What is 1+2?", "计算 11+22 等于多少？请写出每一步，然后给出答案。 Reverse: abcd dcba", "Hi"]
    args = [a for p in prompts for a in ("--prompt", p)]
    llmkit_cli("generate", "--from", "sft", "-w", ws, *args, "--output", tmp_path / "out.jsonl",
               "--set", "max_new_tokens=12", "--set", "greedy=true")
    batched = [json.loads(line) for line in (tmp_path / "out.jsonl").open()]
    model, tokenizer = llmkit.load(ws / "sft")
    alone = [llmkit.generate(model, tokenizer, p, max_new_tokens=12, greedy=True) for p in prompts]
    assert [r["completion"] for r in batched] == alone, family
    assert any(r["new_tokens"] > 1 for r in batched), family  # something was decoded past the first token


def test_eval_scores_perplexity_and_an_lm_eval_task(pipeline):
    family, _, ws = pipeline
    llmkit_cli("eval", "--from", "sft", "-w", ws, "--tasks", "ppl,mmlu_local", "--set", "tokens=null",
               "--set", "ppl.datasets=corpus", "--set", f"harness.data.mmlu_local={DEMO_EVAL / 'mmlu_en_test.jsonl'}",
               "--set", "harness.num_fewshot=0", "--set", "harness.limit=4")
    results = json.loads((ws / "eval" / "sft" / "results.json").read_text())
    _, tokenizer = llmkit.load(ws / "sft")
    assert results["ppl"]["corpus"]["docs"] == 16
    assert 1 < results["ppl"]["corpus"]["ppl"] < tokenizer.vocab_size * 4, family  # a random model: ~ the vocabulary
    metrics = results["harness"]["results"]["mmlu_local"]
    assert 0 <= metrics["acc,none"] <= 1 and results["harness"]["n-samples"]["mmlu_local"]["effective"] == 4


def test_judge_prepares_a_session_of_the_replies_of_two_runs(pipeline):
    from llmkit.judge.session import read_items

    family, _, ws = pipeline
    llmkit_cli("judge", "--prepare", "-w", ws, "--from", "base,sft", "--prompts", "prompts_eval", "--out", "judged",
               "--set", "max_prompts=2", "--set", "generation.max_new_tokens=4")
    items = read_items(ws / "judged")
    assert len(items) == 2, family  # one pair of models, two prompts
    for item in items:
        for side in ("left", "right"):
            model, tokenizer = llmkit.load(ws / item[f"{side}_model"])
            prompt = item["prompt"]
            assert item[side] == llmkit.generate(model, tokenizer, [prompt], max_new_tokens=4, greedy=True)[0]


def test_the_export_is_the_family_and_transformers_gives_its_logits(pipeline, tmp_path):
    family, _, ws = pipeline
    llmkit_cli("export", "--from", "dpo", "--to", tmp_path / "out", "-w", ws)
    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported["architectures"] == [{"qwen3_5": "Qwen3_5ForCausalLM", "smollm3": "SmolLM3ForCausalLM"}[family]]
    record = json.loads((tmp_path / "out" / "llmkit_export.json").read_text())
    assert record["max_abs_logit_diff"] < 1e-4 and record["greedy_tokens_equal"] and record["tokenizer_identical"]
    model, tokenizer = llmkit.load(ws / "dpo")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode("What is 12+30? 你好 😀 " * 8)])  # longer than a delta-rule chunk
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-4


def test_extend_vocab_adds_han_pieces_and_the_extended_model_trains(pipeline):
    family, _, ws = pipeline
    docs = [{"id": f"zh{i}", "prompt": t} for i, t in enumerate(chinese(120, seed=1))]
    write_dataset(ws, "zh_text", docs + [{"id": f"en{i}", "prompt": t} for i, t in enumerate(ENGLISH * 4)])
    llmkit_cli("extend-vocab", "--from", "base", "--in", "zh_text", "--out", "zh", "-w", ws,
               "--set", "new_tokens=40", "--set", "heldout_fraction=0.1")
    (base, old), (extended, new) = llmkit.load(ws / "base"), llmkit.load(ws / "zh")
    assert new.vocab_size > old.vocab_size and new.encode(ENGLISH[1]) == old.encode(ENGLISH[1])
    ids = torch.tensor([old.encode(ENGLISH[1])])
    with torch.no_grad():  # the old pieces' rows are kept: their logits do not move
        assert (extended(ids)[..., :old.vocab_size] - base(ids)).abs().max() < 1e-5, family
    llmkit_cli("sft", "--from", "zh", "--in", "sft_train", "--out", "sft_zh", "-w", ws, *TINY,
               "--set", f"seq_len={SEQ_LEN[family]}", "--set", "max_steps=1")
    assert stats(ws, "sft_zh")["steps"] == 1


def test_status_lists_every_run_done_and_report_plots_them(pipeline):
    family, _, ws = pipeline
    out = llmkit_cli("status", "-w", ws)
    rows = {line.split()[0]: line.split()[1:] for line in out.split("\n\n")[0].splitlines()[1:] if line.strip()}
    for run in ("base", "continued", "sft", "sft_lora", "sft_qlora", "sft_dora", "rm", "dpo", "kto", "grpo", "ppo",
                "distill"):
        assert rows[run][1] == "done", (family, run, rows[run])
    llmkit_cli("report", "sft", "dpo", "kto", "grpo", "distill", "-w", ws)
    report = ws / "report" / "sft+dpo+kto+grpo+distill"
    assert (report / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (report / "summary.md").read_text()
    assert all(f"| {run} | 2 |" in summary for run in ("sft", "dpo", "kto", "grpo", "distill")), summary


@pytest.mark.slow  # a process of its own, to be killed (~15 s on a busy machine)
# one family is enough: what a resume restores does not depend on the layers
@pytest.mark.parametrize("pipeline", ["qwen3_5"], indirect=True)
def test_a_killed_qwen3_5_sft_resumes_to_the_bits_of_a_run_never_stopped(pipeline):
    """SIGKILL while the second checkpoint (step 4 of 6) is written: the rerun resumes from step 2
    and ends on the losses, gradient norms and weights of the run that was never stopped."""
    family, _, ws = pipeline
    sets = [a for s in ["max_steps=6", "save_every=2", "warmup_steps=1", "micro_batch_size=2", "eval_every=0",
                        f"seq_len={SEQ_LEN[family]}", "lr=1e-2", "log_every=1"] for a in ("--set", s)]
    sft = ["sft", "--from", "base", "--in", "sft_train", "-w", str(ws), *sets]
    llmkit_cli(*sft, "--out", "straight")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LLMKIT_KILL_AT")}
    killed = subprocess.run([sys.executable, "-c", "from llmkit.cli.app import main; main()", *sft, "--out", "killed"],
                            env={**env, "OMP_NUM_THREADS": "1", "LLMKIT_KILL_AT": "checkpoint@2"},
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert ckpt.read_latest(ws / "killed") == "step-00000002"
    llmkit_cli(*sft, "--out", "killed")  # the rerun, in this process (one thread, as the killed one)
    curve = lambda run: [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(ws / run)]  # noqa: E731
    assert curve("killed") == curve("straight") and len(curve("straight")) == 6
    a, b = (llmkit.load(ws / run)[0].state_dict() for run in ("killed", "straight"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
