"""The SmolLM2 recipe's general-ability check, as data: the held-out general questions have
checkable answers and share none with the prompts SFT replays, the longer-word reversals are
longer than any trained word, SFT replays the base's replies as a setting, and the summary
puts general ability next to the task's exact match. No model runs here."""

import importlib.util
import json
import sys
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smollm2"
DEMO = RECIPE.parent / "demo"


def load(name: str, folder: Path = RECIPE):
    spec = importlib.util.spec_from_file_location(f"smollm2_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_general_questions_have_checkable_answers_and_are_held_out():
    rows = read_jsonl(RECIPE / "general_eval.jsonl")
    assert 40 <= len(rows) <= 100
    for r in rows:
        assert r["prompt"].strip() and r["lang"] in ("en", "zh")
        assert r["references"] and all(isinstance(a, str) and a.strip() for a in r["references"])
    prompts = [r["prompt"] for r in rows]
    assert len(set(prompts)) == len(prompts)
    mixed_into_sft = {r["prompt"] for r in read_jsonl(RECIPE / "general_prompts.jsonl")}
    assert not mixed_into_sft & set(prompts)


def test_longer_word_reversals_are_longer_than_every_trained_word():
    trained = load("build_tasks", DEMO).WORD_LENGTHS
    rows = read_jsonl(RECIPE / "reversal_long.jsonl")
    assert rows and all(len(r["answer"].split()) > max(trained) for r in rows)
    for r in rows:
        letters = r["prompt"].split("：" if r["lang"] == "zh" else ": ", 1)[1].split()
        assert r["answer"].split() == letters[::-1]


def test_the_sft_replays_the_general_prompts_and_is_gated_on_the_general_questions():
    """The Makefile's replay and gate settings (no script: `replay.prompts`, `gate.files`) are
    SFT settings that resolve, and name the recipe's files."""
    import re

    from llmkit.core.config import parse_overrides, resolve_config
    from llmkit.train.sft import SftConfig

    make = (RECIPE / "Makefile").read_text()
    flags = " ".join(re.search(rf"^{name} \?= (.*(?:\\\n.*)*)", make, re.M).group(1).replace("\\\n", " ")
                     for name in ("REPLAY_FLAGS", "GATE_FLAGS"))
    pairs = [p.replace("$(GENERAL_PROMPTS)", "general_prompts.jsonl").replace("$(TOP)/recipes/smollm2/", "")
             for p in re.findall(r"--set (\S+)", flags)]
    cfg = resolve_config(SftConfig, parse_overrides(pairs))
    assert cfg.replay.prompts == "general_prompts.jsonl" and cfg.replay.ratio == 0.3
    assert cfg.gate.files == ["general_eval.jsonl"] and cfg.gate.tolerance == 0.05
    assert not (RECIPE / "mix_general.py").exists()


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def test_the_summary_shows_general_ability_of_base_sft_and_dpo(tmp_path):
    write_json(tmp_path / "smollm2" / "manifest.json", {"stats": {"parameters": 7}})
    write_json(tmp_path / "recipe" / "parity.json", {"max_abs_logit_diff": 0.0, "tokens": 128,
                                                      "replies": ["x"], "replies_equal": [True]})
    for stage in ("sft", "dpo"):
        write_json(tmp_path / stage / "manifest.json",
                   {"stats": {"steps": 5, "base_accuracy": 0.0, "accuracy": 0.5}, "seconds": 9})
    for run, en, zh in (("smollm2", 0.75, 0.5), ("sft", 0.5, 0.0), ("dpo", 0.25, 0.0)):
        write_json(tmp_path / "eval" / f"general-{run}" / "results.json", {"generation": {
            "general_eval": {"en": {"contains": en, "examples": 4}, "zh": {"contains": zh, "examples": 2}},
            "reversal_long": {"en": {"exact_match": en, "examples": 2}}}})
    summary = load("summary").summary(tmp_path)
    general = summary["general"]
    assert general["smollm2"]["en"] == {"contains": 0.75, "examples": 4}
    assert general["smollm2"]["all"]["contains"] == (0.75 * 4 + 0.5 * 2) / 6
    assert general["dpo"]["all"] == {"contains": 0.25 * 4 / 6, "examples": 6}
    assert summary["longer_words"]["sft"]["all"] == {"exact_match": 0.5, "examples": 2}


def test_the_vocabulary_ablation_trains_every_variant_on_the_same_steps_of_sequences():
    from llmkit.ablate.experiment import read_experiment

    exp = read_experiment(RECIPE / "ablate_vocab.yaml")
    rows, cpt, _ = exp.steps
    steps = {v: exp.settings(v, cpt)["max_steps"] for v in exp.names}
    assert steps["baseline"] == steps["extended"] == exp.settings("two_stage", rows)["max_steps"] + steps["two_stage"]
    assert len({exp.settings(v, s)["micro_batch_size"] for v in exp.names for s in (rows, cpt)}) == 1
    # the extended model's sequences hold as many bytes as the original's (cpt-zh's ratio, 0.52)
    assert exp.settings("extended", cpt)["seq_len"] == exp.settings("two_stage", cpt)["seq_len"] == \
        exp.settings("two_stage", rows)["seq_len"] == round(0.52 * exp.settings("baseline", cpt)["seq_len"])
    assert exp.settings("two_stage", rows)["train_only"] == "new_rows"
    assert "{rows}" in exp.args("two_stage", cpt)
    assert "{rows}" not in exp.args("baseline", cpt) + exp.args("extended", cpt)  # they start from the imports
    assert exp.metrics == [("eval", "ppl/zh_heldout/bits_per_byte")] and len(exp.seeds) >= 2
