"""`llmkit merge` end to end: tiny Llama and Qwen2 models (a base and two fine-tunes of it) saved by
transformers and imported; every method's run holds the tensors mergekit 0.1.5 writes from the same
folders (DARE with the same seed: the same masks); average takes a run's last step folders; bad input
exits 2 naming it and writes nothing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from typer.testing import CliRunner

from llmkit.checkpoints import step_folders as ckpt
from llmkit.cli.app import build_app
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe

runner = CliRunner()
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=64)
FAMILIES = {"llama": (transformers.LlamaConfig, False), "qwen2": (transformers.Qwen2Config, True)}  # tied?
WEIGHTS = {"weight": [0.6, 0.5], "density": [0.5, 0.7]}
SPARSE = ["--from", "a,b", "--base", "base", "--set", "weights=0.6,0.5", "--set", "density=0.5,0.7"]
# method -> (mergekit's config besides the models, llmkit's options)
CASES = {
    "linear": ({}, ["--from", "a,b", "--set", "weights=0.6,0.5"]),
    "slerp": ({"parameters": {"t": [0.0, 0.3, 1.0]}}, ["--from", "a", "--base", "base", "--set", "t=[0,0.3,1]"]),
    "task_arithmetic": ({}, ["--from", "a,b", "--base", "base", "--set", "weights=0.6,0.5"]),
    "ties": ({}, [*SPARSE]),
    "dare_ties": ({}, [*SPARSE, "--set", "seed=7"]),  # mergekit's random_seed is 7 too
    "dare_linear": ({}, [*SPARSE, "--set", "seed=7"]),
}


def llmkit(*args):
    return runner.invoke(build_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def backend():
    return train_bpe(QWEN_SPECIALS)


def save_model(folder, backend, family: str, seed: int, base=None, **shape):
    """A random model (or `base` plus noise on every weight, norms included: a fine-tune) in `folder`."""
    cls, tied = FAMILIES[family]
    save_folder(folder, backend, QWEN25_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        cls(vocab_size=backend.get_vocab_size(), tie_word_embeddings=tied, **{**SHAPE, **shape}))
    if base is not None:
        with torch.no_grad():
            for p, q in zip(model.parameters(), transformers.AutoModelForCausalLM.from_pretrained(base).parameters()):
                p.copy_(q + 0.02 * torch.randn_like(q))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=list(FAMILIES))
def models(request, backend, tmp_path_factory):
    """(family, transformers folders by name, a workspace where each is imported under its name)."""
    root = tmp_path_factory.mktemp(request.param)
    folders = {"base": save_model(root / "base", backend, request.param, 0)}
    for seed, name in enumerate(["a", "b"], start=1):
        folders[name] = save_model(root / name, backend, request.param, seed, base=folders["base"])
    ws = root / "ws"
    for name, folder in folders.items():
        assert llmkit("import", "--from", folder, "--out", name, "-w", ws).exit_code == 0
    return request.param, folders, ws


def mergekit_merge(method: str, folders: dict, out, extra: dict) -> dict:
    """mergekit's tensors (under llmkit's names) for the case's models and parameters."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    from llmkit.hf.import_ import read_hf_folder

    if method == "slerp":
        config = {"base_model": str(folders["base"]), "models": [{"model": str(folders[n])} for n in ("base", "a")]}
    else:
        config = {"models": [{"model": str(folders[n]), "parameters": {k: v[i] for k, v in WEIGHTS.items()
                                                                        if method != "linear" or k == "weight"}}
                             for i, n in enumerate(("a", "b"))]}
        if method != "linear":
            config["base_model"] = str(folders["base"])
    run_merge(MergeConfiguration.model_validate({"merge_method": method, **config, **extra}), str(out),
              MergeOptions(random_seed=7, quiet=True, write_model_card=False))
    return read_hf_folder(out).state_dict


@pytest.mark.parametrize("method", list(CASES))
def test_every_method_writes_the_tensors_mergekit_writes(models, method, tmp_path):
    pytest.importorskip("mergekit")
    family, folders, ws = models
    extra, args = CASES[method]
    r = llmkit("merge", "--method", method, *args, "--out", f"m_{method}", "-w", ws)
    assert r.exit_code == 0, r.output
    ours, _ = ckpt.load_weights(ws / f"m_{method}")
    theirs = mergekit_merge(method, folders, tmp_path / "mergekit", extra)
    assert set(ours) == set(theirs)
    diff = max((ours[k] - theirs[k]).abs().max().item() for k in theirs)
    assert diff <= 1e-6, (family, method, diff)


def test_the_run_records_the_merge_and_every_stage_reads_it(models):
    _, _, ws = models
    r = llmkit("merge", "--method", "dare_ties", "--from", "a,b", "--base", "base", "--set", "density=0.5",
               "--out", "dare", "-w", ws)
    assert r.exit_code == 0, r.output
    manifest = json.loads((ws / "dare" / "manifest.json").read_text())
    stats = manifest["stats"]
    assert (stats["method"], stats["weights"], stats["density"], stats["seed"]) == ("dare_ties", [1.0, 1.0],
                                                                                     [0.5, 0.5], 0)
    fingerprints = {json.loads((ws / n / "manifest.json").read_text())["fingerprint"] for n in ("a", "b", "base")}
    assert {i["fingerprint"] for i in stats["inputs"]} | {stats["base"]["fingerprint"]} == fingerprints
    assert {i["fingerprint"] for i in manifest["inputs"]} == fingerprints
    assert "up to date" in llmkit("merge", "--method", "dare_ties", "--from", "a,b", "--base", "base", "--set",
                                  "density=0.5", "--out", "dare", "-w", ws).output
    r = llmkit("generate", "--from", "dare", "--prompt", "hello", "--set", "max_new_tokens=3", "-w", ws)
    assert r.exit_code == 0, r.output


def test_average_is_the_mean_of_the_run_s_last_step_folders(models):
    _, _, ws = models
    run = ws / "a"
    first = run / ckpt.step_dir_name(0)
    state, _ = ckpt.load_weights(first)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if state["lm_head.weight"] is state[
        "model.embed_tokens.weight"] else {}
    for step in (1, 2, 3):  # three more saves, each weight moved by `step`
        folder = run / ckpt.step_dir_name(step)
        shutil.copytree(first, folder)
        ckpt.save_weights(folder / ckpt.WEIGHTS, {k: v + step for k, v in state.items()}, tied)
    r = llmkit("merge", "--method", "average", "--from", "a", "--set", "last=3", "--out", "soup", "-w", ws)
    assert r.exit_code == 0, r.output
    merged, _ = ckpt.load_weights(ws / "soup")
    assert all(torch.allclose(merged[k], state[k] + 2, atol=1e-6) for k in state)
    stats = json.loads((ws / "soup" / "manifest.json").read_text())["stats"]
    assert [i["step"] for i in stats["inputs"]] == [ckpt.step_dir_name(s) for s in (1, 2, 3)]
    r = llmkit("merge", "--method", "average", "--from", "a", "--set", "last=5", "--out", "soup5", "-w", ws)
    assert r.exit_code == 2 and "has 4 complete step folder(s)" in r.output and not (ws / "soup5").exists()


@pytest.mark.parametrize("models", ["llama"], indirect=True)  # one family: LoRA loading is family-blind
def test_a_lora_run_is_merged_as_its_merged_weights(models):
    from llmkit.checkpoints.loading import load_model
    from llmkit.merge.methods import linear
    from tests.train.posttrain_fixtures import addition_rows, write_dataset

    family, _, ws = models
    write_dataset(ws, "sft_train", addition_rows(8))
    r = llmkit("sft", "--from", "a", "--out", "a_lora", "-w", ws, "--set", "lora.r=4", "--set", "lora.alpha=8",
               "--set", "max_steps=1", "--set", "warmup_steps=0", "--set", "micro_batch_size=2", "--set",
               "eval_every=0", "--set", "seq_len=64", "--set", "lr=0.05")
    assert r.exit_code == 0, r.output
    r = llmkit("merge", "--method", "linear", "--from", "a_lora,b", "--out", "with_lora", "-w", ws)
    assert r.exit_code == 0, r.output
    merged, _ = ckpt.load_weights(ws / "with_lora")
    lora = load_model(ws / "a_lora")[0].state_dict()
    b, _ = ckpt.load_weights(ws / "b")
    a, _ = ckpt.load_weights(ws / "a")
    assert any(not torch.equal(lora[k], a[k]) for k in a)  # the adapters moved some weights
    assert all(torch.allclose(merged[k], linear([lora[k], b[k]], [1.0, 1.0]), atol=1e-6) for k in b)
    stats = json.loads((ws / "with_lora" / "manifest.json").read_text())["stats"]
    assert [i["lora"] for i in stats["inputs"]] == [True, False]


@pytest.fixture(scope="module")
def odd_models(models, backend, tmp_path_factory):
    """The workspace plus `deeper` (another shape), `other_vocab` (same shape, another tokenizer) and
    `cousin` (same shape and tokenizer, the other family)."""
    family, folders, ws = models
    root = tmp_path_factory.mktemp("odd")
    deeper = save_model(root / "deeper", backend, family, 5, num_hidden_layers=4)
    other = save_model(root / "other", train_bpe(QWEN_SPECIALS[::-1]), family, 6)
    cousin = save_model(root / "cousin", backend, "qwen2" if family == "llama" else "llama", 7)  # same shape
    for name, folder in (("deeper", deeper), ("other_vocab", other), ("cousin", cousin)):
        assert llmkit("import", "--from", folder, "--out", name, "-w", ws).exit_code == 0
    return ws


@pytest.mark.parametrize("args, said", [
    (["--method", "linear", "--from", "a,deeper"], "n_layers 3 vs 4"),
    (["--method", "ties", "--from", "a,other_vocab", "--base", "base"], "their tokenizers differ"),
    (["--method", "task_arithmetic", "--from", "a,cousin", "--base", "base"], "their models differ"),
    (["--method", "linear", "--from", "a,b", "--set", "weights=0.5,0.3,0.2"], "weights has 3 value(s)"),
    (["--method", "ties", "--from", "a,b", "--base", "base", "--set", "density=1.5"], "density must be in (0, 1]"),
    (["--method", "dare_ties", "--from", "a,b", "--base", "base", "--set", "density=0"], "density must be in (0, 1]"),
    (["--method", "frankenmerge", "--from", "a,b"], "merge method 'frankenmerge' is unknown"),
    (["--method", "slerp", "--from", "a,b", "--base", "base"], "slerp interpolates the base and one other"),
    (["--method", "ties", "--from", "a,b"], "needs --base"),
    (["--method", "linear", "--from", "a,missing"], "missing"),
])
def test_bad_input_exits_2_naming_it_and_writes_nothing(odd_models, args, said):
    ws = odd_models
    before = sorted(p.name for p in ws.iterdir())
    r = llmkit("merge", *args, "--out", "refused", "-w", ws)
    assert r.exit_code == 2 and said in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output and sorted(p.name for p in ws.iterdir()) == before
