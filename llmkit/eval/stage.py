"""`llmkit eval`: a checkpoint's report in `eval/<name>/` (results.json + a printed table).

Tasks (`tasks: [ppl, choice, generation, reward, efficiency, long, harness]`, any subset, in that order):
- ppl: perplexity of the token artifact's val split (`tokens`) and of `ppl.datasets`;
- choice: multiple-choice accuracy on `choice.files`;
- generation: BLEU / ROUGE (and exact match) of greedy replies on `generation.files`;
- reward: `reward.model`'s pairwise accuracy on `reward.preferences`, and the win rate of this
  checkpoint over `reward.reference` on `reward.prompts`, judged by that reward model;
- efficiency: generation latency, tokens/s, peak memory;
- long: needle-in-a-haystack and RULER-style retrieval at `long.lengths` x `long.depths`, en and zh,
  generated offline (llmkit.eval.long_context);
- harness: lm-evaluation-harness tasks `harness.tasks` (`--tasks NAME,…`), offline, through
  llmkit's own LM (llmkit.eval.harness, llmkit.eval.harness_lm): lm-eval's results as it reports them.

The report is an artifact: its inputs are the checkpoint run and every dataset, file and run the
tasks read, and its config names the step evaluated, so a new checkpoint or an edited eval file
makes it stale. `results.json` holds every number; the manifest's stats hold the headline ones.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmkit.checkpoints.step_folders import checkpoint_step_dir
from llmkit.errors import ConfigError, UserError
from llmkit.eval.choice import ChoiceConfig, evaluate_choice
from llmkit.eval.efficiency import EfficiencyConfig, evaluate_efficiency
from llmkit.eval.generation import GenerationConfig, evaluate_generation
from llmkit.eval.long_context import LongContextConfig, SAMPLES_FILE as LONG_SAMPLES, evaluate_long_context
from llmkit.eval.long_context import headline as long_headline
from llmkit.eval.harness import HarnessConfig, harness_files, headline as harness_headline, run_harness
from llmkit.eval.perplexity import PerplexityConfig, text_perplexity, token_split_perplexity
from llmkit.eval.preference import RewardConfig, judge_policies, pairwise_accuracy, policy_replies
from llmkit.eval.provenance import contamination_warnings, harness_notes
from llmkit.data.input_files import (eval_input, input_name, parse_questions, read_rows, require_columns,
                               resolve_checkpoint)
from llmkit.model.decode_weights import DecodeConfig, decoding_weights
from llmkit.model.lm_scoring import LMScorer, resolve_device
from llmkit.core.progress import print_summary
from llmkit.checkpoints.loading import load, load_reward_model, load_tokenizer

TASKS = ("ppl", "choice", "generation", "reward", "efficiency", "long", "harness")
RESULTS = "results.json"


@dataclass
class EvalConfig:
    tasks: list[str] = field(default_factory=lambda: ["ppl"])  # any of TASKS; they run in that order
    tokens: str | None = "tokens"   # token artifact whose split `ppl` scores (null: only ppl.datasets)
    step: str | None = None         # step folder of the run to evaluate (null: its latest; set from --from)
    device: str = "auto"            # auto = cuda when available, else cpu
    dtype: str = "float32"          # float32 | bfloat16 | float16 (autocast while scoring)
    batch_tokens: int = 8192        # padded tokens per scoring forward pass
    seed: int = 0                   # sampling seed (reward.temperature > 0)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # decode.weights=bf16|int8: every task's CPU products
    ppl: PerplexityConfig = field(default_factory=PerplexityConfig)  # datasets, window, max_docs
    choice: ChoiceConfig = field(default_factory=ChoiceConfig)  # question files, shots, format
    generation: GenerationConfig = field(default_factory=GenerationConfig)  # prompt/reference files
    reward: RewardConfig = field(default_factory=RewardConfig)  # judge, pairs, win-rate reference
    efficiency: EfficiencyConfig = field(default_factory=EfficiencyConfig)  # batch sizes, lengths
    long: LongContextConfig = field(default_factory=LongContextConfig)  # tests, lengths, depths, languages
    harness: HarnessConfig = field(default_factory=HarnessConfig)  # lm-eval tasks, files, shots, limit

    def __post_init__(self):
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise ConfigError(f"tasks: unknown {', '.join(unknown) or '(none given)'}; choose from "
                              f"{', '.join(TASKS)}")
        if "ppl" in self.tasks and not self.tokens and not self.ppl.datasets:
            raise ConfigError("tasks has ppl but there is nothing to score: set tokens=<token artifact> "
                              "or ppl.datasets=<dataset or file,...>")
        if "choice" in self.tasks and not self.choice.files:
            raise ConfigError("tasks has choice: set choice.files=<question file,...>")
        if "generation" in self.tasks and not self.generation.files:
            raise ConfigError("tasks has generation: set generation.files=<prompt/reference file,...>")
        if "reward" in self.tasks:
            r = self.reward
            if not r.model:
                raise ConfigError("tasks has reward: set reward.model=<reward-model run>")
            if not r.preferences and not (r.prompts and r.reference):
                raise ConfigError("tasks has reward: set reward.preferences (pairwise accuracy) and/or "
                                  "reward.prompts + reward.reference (win rate)")
            if bool(r.prompts) != bool(r.reference):
                raise ConfigError("the win rate needs both reward.prompts and reward.reference")
        if "harness" in self.tasks and not self.harness.tasks:
            raise ConfigError("tasks has harness: name lm-eval tasks with --tasks NAME,... "
                              "(or --set harness.tasks=NAME,...)")
        if self.batch_tokens < 1:
            raise ConfigError(f"batch_tokens must be ≥ 1, got {self.batch_tokens}")


def split_task_names(names: str) -> dict:
    """`--tasks ppl,mmlu_local` -> config flags: llmkit's own tasks in `tasks`, the others (lm-eval
    tasks) in `harness.tasks`, with `harness` among the tasks."""
    given = [n.strip() for n in names.split(",") if n.strip()]
    if not given:
        raise UserError("--tasks: name at least one task")
    own = [n for n in given if n in TASKS and n != "harness"]
    lm_eval_tasks = [n for n in given if n not in TASKS]
    flags: dict = {"tasks": own + (["harness"] if lm_eval_tasks else [])}
    if lm_eval_tasks:
        flags["harness"] = {"tasks": lm_eval_tasks}
    return flags


# -- inputs ------------------------------------------------------------------------------------

class Inputs:
    """Every artifact and file the tasks read, opened once, listed for the fingerprint."""

    def __init__(self, ws, cfg: EvalConfig, run):
        self.run = run
        tasks = cfg.tasks
        self.tokens = ws.artifact(cfg.tokens) if "ppl" in tasks and cfg.tokens else None
        self.ppl = _open_all(ws, cfg.ppl.datasets if "ppl" in tasks else [])
        self.choice = _open_all(ws, cfg.choice.files if "choice" in tasks else [])
        self.choice_dev = _open_all(ws, cfg.choice.dev_files if "choice" in tasks else [])
        self.generation = _open_all(ws, cfg.generation.files if "generation" in tasks else [])
        r = cfg.reward if "reward" in tasks else RewardConfig()
        self.reward_model = ws.artifact(r.model) if r.model else None
        self.preferences = _open_all(ws, [r.preferences] if r.preferences else [])
        self.prompts = _open_all(ws, [r.prompts] if r.prompts else [])
        self.reference = ws.artifact(r.reference) if r.reference else None
        self.harness = _open_all(ws, harness_files(cfg.harness) if "harness" in tasks else [])
        self.efficiency = _open_all(ws, cfg.efficiency.models if "efficiency" in tasks else [])

    def all(self) -> list:
        singles = [a for a in (self.run, self.tokens, self.reward_model, self.reference) if a is not None]
        return singles + self.ppl + self.choice + self.choice_dev + self.generation + \
            self.preferences + self.prompts + self.harness + self.efficiency


def _open_all(ws, specs: list[str]) -> list:
    return [eval_input(ws, s) for s in specs]


# -- tasks ----------------------------------------------------------------------------------------

@dataclass
class EvalRun:
    """What every task reads: the checkpoint under evaluation, its inputs, where files go."""

    cfg: EvalConfig
    inputs: Inputs
    model: object        # llmkit Transformer, eval mode
    tokenizer: object
    scorer: object       # LMScorer of the model
    chat: bool           # the model answers in the chat template
    device: object
    out_dir: Path


def eval_perplexity(run: EvalRun) -> dict:
    cfg, out = run.cfg.ppl, {}
    if run.inputs.tokens is not None:
        out[f"{run.inputs.tokens.name}:{cfg.split}"] = token_split_perplexity(
            run.scorer, run.tokenizer, run.inputs.tokens.path, cfg)
    for art in run.inputs.ppl:
        rows = read_rows(art, cfg.max_docs, columns=None if art.stage == "file" else ["text", "source"])
        require_columns(rows, art, "text")
        out[input_name(art)] = text_perplexity(run.scorer, run.tokenizer, rows, cfg)
    return out


def eval_choice(run: EvalRun) -> dict:
    out = {}
    for k, art in enumerate(run.inputs.choice):
        name = input_name(art)
        questions = parse_questions(read_rows(art), name)
        dev = None
        if run.inputs.choice_dev:
            dev_art = run.inputs.choice_dev[k]
            dev = parse_questions(read_rows(dev_art), input_name(dev_art))
        out[name] = evaluate_choice(run.scorer, run.tokenizer, questions, run.cfg.choice, dev)
    return out


def eval_generation(run: EvalRun) -> dict:
    out = {}
    for art in run.inputs.generation:
        name = input_name(art)
        rows = read_rows(art, run.cfg.generation.max_examples)
        out[name], samples = evaluate_generation(run.model, run.tokenizer, rows, run.cfg.generation,
                                                 chat=run.chat, device=run.device, name=name)
        _write_jsonl(run.out_dir / f"generations-{name}.jsonl", samples)
    return out


def load_judge(reward_run):
    """(reward model, its tokenizer) of a reward-model run."""
    return load_reward_model(reward_run.path), load_tokenizer(checkpoint_step_dir(reward_run.path))


def eval_reward(run: EvalRun) -> dict:
    rc, inputs = run.cfg.reward, run.inputs
    judge = load_judge(inputs.reward_model)
    out: dict = {"reward_model": str(inputs.reward_model.path)}
    for art in inputs.preferences:
        rows = read_rows(art, rc.max_rows)
        require_columns(rows, art, "prompt|messages", "chosen", "rejected")
        out["pairwise"] = pairwise_accuracy(*judge, rows, batch_size=rc.batch_size, device=run.device)
    for art in inputs.prompts:
        rows = read_rows(art, rc.max_rows)
        policy = policy_replies(run.model, run.tokenizer, rows, rc, chat=run.chat, device=run.device,
                                seed=run.cfg.seed)
        ref_model, ref_tokenizer = load(inputs.reference.path)
        reference = policy_replies(ref_model, ref_tokenizer, rows, rc, device=run.device,
                                   seed=run.cfg.seed, chat=ref_model.trained_on_chats)
        del ref_model  # before the judge runs: three models need not share the memory
        win, samples = judge_policies(judge, rows, policy, reference, batch_size=rc.batch_size,
                                      device=run.device)
        out["win_rate"] = {**win, "reference": str(inputs.reference.path)}
        _write_jsonl(run.out_dir / "win-rate.jsonl", samples)
    return out


def eval_efficiency(run: EvalRun) -> dict:
    return evaluate_efficiency(run.model, run.cfg.efficiency, device=run.device,
                               weights=run.inputs.run.path / run.cfg.step,
                               models=[art.path for art in run.inputs.efficiency])


def eval_long(run: EvalRun) -> dict:
    results, samples = evaluate_long_context(run.model, run.tokenizer, run.cfg.long, chat=run.chat,
                                             device=run.device)
    _write_jsonl(run.out_dir / LONG_SAMPLES, samples)
    return results


def eval_harness(run: EvalRun) -> dict:
    from llmkit.eval.harness_lm import LlmkitLM

    hc = run.cfg.harness
    lm = LlmkitLM(run.model, run.tokenizer, device=run.device, dtype=run.cfg.dtype,
                  batch_tokens=run.cfg.batch_tokens, generation_batch_size=hc.generation_batch_size,
                  max_gen_toks=hc.max_gen_toks, name=str(run.inputs.run.path), prompt_start=hc.prompt_start)
    return run_harness(lm, hc)


TASK_RUNNERS = {"ppl": eval_perplexity, "choice": eval_choice, "generation": eval_generation,
                "reward": eval_reward, "efficiency": eval_efficiency, "long": eval_long,
                "harness": eval_harness}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


# -- the stage ---------------------------------------------------------------------------------

def headline(results: dict) -> dict:
    """The numbers worth a glance, flat: `ppl/tokens:val`, `ppl/zh_heldout/bits_per_byte`, `choice/mmlu/acc`, …"""
    flat = {}
    for name, r in results.get("ppl", {}).items():
        flat[f"ppl/{name}"] = r["ppl"]
        if "bits_per_byte" in r:  # texts: a loss two tokenizers can be compared by (ablate reads it)
            flat[f"ppl/{name}/bits_per_byte"] = r["bits_per_byte"]
    for name, r in results.get("choice", {}).items():
        flat[f"choice/{name}/acc"] = r["acc"]
        flat[f"choice/{name}/acc_norm"] = r["acc_norm"]
    for name, by_lang in results.get("generation", {}).items():
        for lang, r in by_lang.items():
            for metric in ("bleu", "rougeL", "exact_match"):
                flat[f"generation/{name}/{lang}/{metric}"] = r[metric]
    reward = results.get("reward", {})
    if "pairwise" in reward:
        flat["reward/pairwise_accuracy"] = reward["pairwise"]["accuracy"]
    if "win_rate" in reward:
        flat["reward/win_rate"] = reward["win_rate"]["win_rate"]
    for r in results.get("efficiency", {}).get("runs", []):
        flat[f"efficiency/batch{r['batch_size']}/tokens_per_s"] = r["tokens_per_s"]
    if "efficiency" in results:
        flat["efficiency/peak_memory_bytes"] = results["efficiency"]["peak_memory"]["bytes"]
    flat.update(long_headline(results.get("long", {})))
    flat.update(harness_headline(results.get("harness", {})))
    return flat


def run_eval(ctx, cfg: EvalConfig, run: str = "pretrain"):
    """Evaluate `run` (a checkpoint run, or one of its step folders) into `eval/<--out or run name>`."""
    run_art, step = resolve_checkpoint(ctx.workspace, run, cfg.step)
    cfg = dataclasses.replace(cfg, step=step)  # the report names the step it measured
    inputs = Inputs(ctx.workspace, cfg, run_art)
    b = ctx.workspace.builder(str(Path("eval") / (ctx.out or run_art.name)), stage="eval", config=cfg,
                              inputs=inputs.all(), force=ctx.force)
    if b.up_to_date:
        return b
    device = resolve_device(cfg.device)
    model, tokenizer = load(run_art.path / step)
    chat = cfg.generation.prompt_format == "chat" or (
        cfg.generation.prompt_format == "auto" and model.trained_on_chats)  # as `generate` decides
    scorer = LMScorer(model, device=device, dtype=cfg.dtype, batch_tokens=cfg.batch_tokens)
    results: dict = {"run": str(run_art.path), "step": step, "tasks": list(cfg.tasks)}
    with b, decoding_weights(model, cfg.decode.weights):
        evaluation = EvalRun(cfg, inputs, model, tokenizer, scorer, chat, device, b.dir)
        for task in [t for t in TASKS if t in cfg.tasks]:
            started = time.time()
            results[task] = TASK_RUNNERS[task](evaluation)
            print(f"eval: {task} done in {time.time() - started:.1f}s", flush=True)
        (b.dir / RESULTS).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
        b.stats.update(headline(results))
        b.stats.update(contamination_warnings(
            run_art, inputs.choice + inputs.generation + inputs.ppl))
        b.stats.update(harness_notes(run_art, results.get("harness", {}).get("scored_files", {})))
    print_summary(f"{b.name} ({run_art.name}/{step})", list(b.stats.items()))
    return b
