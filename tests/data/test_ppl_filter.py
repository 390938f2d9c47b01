"""ppl-filter with a tiny LM trained here on the demo corpus: planted gibberish goes, real text stays."""

import gzip
import json
import math
import random
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import DatasetWriter, read_table
from llmkit.data.ppl_filter import (KenLMScorer, PplFilterConfig, bucket_edges, ccnet_normalize,
                                    perplexities, removal_reasons)
from llmkit.errors import ConfigError, UserError
from llmkit.model.transformer import Transformer
from llmkit.model.config import ModelConfig
from llmkit.tokenizers.sentencepiece import CONFIG_FILE, MODEL_FILE, Tokenizer
from llmkit.data.tokenizer_training import TokenizerConfig, tokenizer_config_json, train_sentencepiece
from llmkit.core.workspace import Workspace
from tests.train.posttrain_fixtures import write_checkpoint_run

RAW = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "raw"
SOURCES = ("zh_poems.jsonl", "zh_prose.jsonl", "en_docstrings.jsonl.gz")
CHARS = 300  # documents are scored on this many characters: enough to judge, cheap to score


def demo_rows(name: str) -> list[dict]:
    opener = gzip.open if name.endswith(".gz") else open
    with opener(RAW / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def train_lm(texts: list[str], directory: Path, steps: int = 300):
    """A sentencepiece tokenizer and a one-block transformer trained on `texts` (plain torch loop)."""
    cfg = TokenizerConfig(vocab_size=1100)
    sp_model, _ = train_sentencepiece(texts, cfg, log=lambda *a: None)
    directory.mkdir(parents=True)
    (directory / MODEL_FILE).write_bytes(sp_model)
    (directory / CONFIG_FILE).write_text(json.dumps(tokenizer_config_json(cfg, sp_model)))
    tok = Tokenizer(directory)
    stream = np.concatenate([np.array([*ids, tok.eos_id]) for ids in tok.encode_batch(texts)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses time to thread hand-offs
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, n_layers=1, n_heads=2,
                                    n_kv_heads=1, intermediate_size=64, max_seq_len=128))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    rng = np.random.default_rng(0)
    try:
        for _ in range(steps):
            starts = rng.integers(0, len(stream) - 65, 8)
            batch = torch.tensor(np.stack([stream[s:s + 65] for s in starts]), dtype=torch.long)
            loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1),
                                                     batch[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), tok


def write_dataset(ws: Path, name: str, rows: list[dict]) -> None:
    b = Workspace(ws).builder(name, stage="ingest", config={}, quiet=True)
    with b:
        w = DatasetWriter(b.dir)
        w.write(pa.Table.from_pylist(rows))
        w.close()


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """Workspace with `lm` (trained on demo text) and `docs`: held-out real rows + planted gibberish."""
    tmp = tmp_path_factory.mktemp("pplf")
    rng = random.Random(0)
    train, held = [], []
    for name in SOURCES:
        real = [r for r in demo_rows(name) if r["planted"] == "none"]
        rng.shuffle(real)
        held += real[:60]
        train += real[60:60 + (150 if name.endswith(".gz") else 50)]
    gibberish = [r for r in demo_rows("noise.jsonl") if r["planted"].startswith("gibberish")]
    model, tok = train_lm([r["text"][:CHARS] for r in train], tmp / "tok")
    write_checkpoint_run(tmp / "ws", "lm", model, tok)
    rows = [{"id": r["id"], "text": r["text"], "source": r["source"], "lang": r["lang"],
             "gibberish": r["planted"] != "none"} for r in held + gibberish]
    random.Random(1).shuffle(rows)
    write_dataset(tmp / "ws", "docs", rows)
    return tmp / "ws"


def llmkit(*args):
    return CliRunner().invoke(build_app(), [str(a) for a in args])


def test_gibberish_has_the_highest_perplexity_and_falls_in_the_tail(ws):
    r = llmkit("ppl-filter", "-w", ws, "--in", "docs", "--model", "lm", "--set", "percentiles=30,80",
               "--set", f"max_chars={CHARS}")
    assert r.exit_code == 0, r.output
    kept, removed = read_table(ws / "filtered"), read_table(ws / "filtered" / "removed")
    real_ppl = [p for p, g in zip(kept["ppl"].to_pylist() + removed["ppl"].to_pylist(),
                                  kept["gibberish"].to_pylist() + removed["gibberish"].to_pylist()) if not g]
    gibberish_ppl = [p for p, g in zip(removed["ppl"].to_pylist(), removed["gibberish"].to_pylist()) if g]
    assert len(gibberish_ppl) == 40 and not any(kept["gibberish"].to_pylist())  # all removed
    assert min(gibberish_ppl) > np.percentile(real_ppl, 90)
    assert set(removed["reason"].to_pylist()) == {"ppl_bucket_tail"}
    assert kept.num_rows >= 0.9 * len(real_ppl)  # ≥ 90% of the real rows are kept
    stats = json.loads((ws / "filtered" / "manifest.json").read_text())["stats"]
    assert stats["rows_in"] == 220 == stats["rows_out"] + stats["rows_removed"]
    assert stats["removed_by_reason"] == {"ppl_bucket_tail": removed.num_rows}
    inputs = [Path(i["path"]).name for i in json.loads((ws / "filtered" / "manifest.json").read_text())["inputs"]]
    assert inputs == ["docs", "lm"]
    assert "up to date" in llmkit("ppl-filter", "-w", ws, "--in", "docs", "--model", "lm",
                                  "--set", "percentiles=30,80", "--set", f"max_chars={CHARS}").output


def test_threshold_removes_rows_above_it_and_keeps_every_column(ws):
    r = llmkit("ppl-filter", "-w", ws, "--in", "docs", "--model", "lm", "--out", "thr",
               "--set", "max_ppl=40", "--set", f"max_chars={CHARS}")
    assert r.exit_code == 0, r.output
    kept, removed = read_table(ws / "thr"), read_table(ws / "thr" / "removed")
    assert max(kept["ppl"].to_pylist()) <= 40 < min(removed["ppl"].to_pylist())
    assert set(removed["reason"].to_pylist()) == {"ppl_above_threshold"}
    assert {"id", "text", "source", "lang", "gibberish", "ppl"} <= set(kept.column_names)
    assert max(len(t) for t in kept["text"].to_pylist()) > CHARS  # scored on a prefix, kept whole
    assert kept.num_rows + removed.num_rows == 220


def test_a_missing_model_is_a_user_error(ws):
    r = llmkit("ppl-filter", "-w", ws, "--in", "docs")
    assert r.exit_code == 2 and "--model" in r.output


# -- decisions, without a model ---------------------------------------------------------------

def test_buckets_are_computed_per_group():
    ppl = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000.0])
    codes = np.array([0] * 10 + [1] * 10)  # en, zh
    cfg = PplFilterConfig(percentiles=[30, 60], keep_buckets=["head", "middle"], group_by="lang")
    edges = bucket_edges(ppl, codes, cfg.percentiles)
    assert edges[0] == pytest.approx([3.7, 6.4])
    reasons = removal_reasons(ppl, codes, edges, cfg)
    # the same 4 highest of each language go, though every zh row is above every en row
    assert [i for i, r in enumerate(reasons) if r] == [6, 7, 8, 9, 16, 17, 18, 19]
    one = np.zeros(20, np.int64)
    whole = removal_reasons(ppl, one, bucket_edges(ppl, one, [30, 60]), PplFilterConfig(keep_buckets=["head"]))
    assert set(whole[6:]) == {"ppl_bucket_middle", "ppl_bucket_tail"} and not any(whole[:6])


def test_an_empty_document_cannot_be_scored_and_is_kept():
    ppl = perplexities(np.array([0.0, 2.0, 9.0]), np.array([0, 1, 1]))
    assert math.isnan(ppl[0]) and ppl[1] == pytest.approx(math.exp(2))
    codes = np.zeros(3, np.int64)
    assert removal_reasons(ppl, codes, None, PplFilterConfig(max_ppl=5.0)) == [
        None, "ppl_above_threshold", "ppl_above_threshold"]
    cfg = PplFilterConfig(keep_buckets=["tail"])
    assert removal_reasons(ppl, codes, bucket_edges(ppl, codes, cfg.percentiles), cfg)[0] is None


def test_group_by_a_missing_column_is_a_user_error(ws):
    r = llmkit("ppl-filter", "-w", ws, "--in", "docs", "--model", "lm", "--out", "g",
               "--set", "group_by=country")
    assert r.exit_code == 2 and "country" in r.output


@pytest.mark.parametrize("bad", [dict(percentiles=[60, 30]), dict(keep_buckets=["top"]),
                                 dict(max_ppl=0), dict(backend="kenlm"), dict(window=8, stride=8)])
def test_bad_settings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        PplFilterConfig(**bad)


# -- KenLM ------------------------------------------------------------------------------------

def test_kenlm_backend_without_the_module_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "kenlm", None)  # import kenlm -> ImportError
    with pytest.raises(UserError, match="pip install"):
        KenLMScorer(PplFilterConfig(backend="kenlm", kenlm_model=str(tmp_path / "lm.bin")))


def test_kenlm_perplexity_is_ccnets(monkeypatch, tmp_path):
    """CCNet: pp = 10 ** (−Σ log10 p / Σ (words + 1)) over the normalised non-empty lines."""
    scored = []

    class Model:
        def __init__(self, path):
            pass

        def score(self, line, bos=True, eos=True):
            scored.append(line)
            return -0.5 * (len(line.split()) + 1)  # log10 p: each word and </s> has p = 10^-0.5

    monkeypatch.setitem(sys.modules, "kenlm", types.SimpleNamespace(Model=Model))
    (tmp_path / "lm.bin").write_bytes(b"")
    scorer = KenLMScorer(PplFilterConfig(backend="kenlm", kenlm_model=str(tmp_path / "lm.bin")))
    ppl = perplexities(*scorer.score(["Hello World 2024\n\nÉcole", ""]))
    assert scored == ["hello world 0000", "ecole"]
    assert ppl[0] == pytest.approx(10 ** 0.5) and math.isnan(ppl[1])
    assert ccnet_normalize("  Café 42 ") == "cafe 00"


def test_group_by_lang_works_on_a_mixed_file_straight_from_ingest(monkeypatch, tmp_path):
    """ingest labels each row's script in `lang`; ppl-filter then buckets each language apart,
    although this scorer puts every Chinese document above every English one."""

    class Model:  # log10 p of -0.01 per character: perplexity grows with characters per word
        def __init__(self, path):
            pass

        def score(self, line, bos=True, eos=True):
            return -0.01 * len(line)

    monkeypatch.setitem(sys.modules, "kenlm", types.SimpleNamespace(Model=Model))
    (tmp_path / "lm.bin").write_bytes(b"")
    docs = [{"id": f"zh{i}", "text": "床前明月光" * (i + 10)} for i in range(10)]
    docs += [{"id": f"en{i}", "text": " ".join(["moon" + "n" * i] * 5)} for i in range(10)]
    random.Random(0).shuffle(docs)
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n"
                                                  for d in docs))
    ws = tmp_path / "ws"
    assert llmkit("ingest", tmp_path / "mixed.jsonl", "-w", ws).exit_code == 0
    kenlm = ["--set", "backend=kenlm", "--set", f"kenlm_model={tmp_path / 'lm.bin'}"]
    r = llmkit("ppl-filter", "-w", ws, "--in", "raw", *kenlm, "--set", "group_by=lang")
    assert r.exit_code == 0, r.output
    removed = read_table(ws / "filtered" / "removed").column("id").to_pylist()
    # each language loses its 4 longest-worded documents
    assert sorted(removed) == [f"{lang}{i}" for lang in ("en", "zh") for i in range(6, 10)]
    assert "kept head+middle buckets (percentiles 30/60 of each lang): 60% of rows by design" \
        in " ".join(r.output.split())
    stats = json.loads((ws / "filtered" / "manifest.json").read_text())["stats"]
    assert set(stats["ppl"]["bucket_edges"]) == {"zh", "latin"}


def test_a_threshold_that_keeps_nothing_is_refused_unless_allowed(monkeypatch, tmp_path):
    class Model:
        def __init__(self, path):
            pass

        def score(self, line, bos=True, eos=True):
            return -1.0

    monkeypatch.setitem(sys.modules, "kenlm", types.SimpleNamespace(Model=Model))
    (tmp_path / "lm.bin").write_bytes(b"")
    ws = tmp_path / "ws"
    write_dataset(ws, "docs", [{"id": f"d{i}", "text": f"document {i}"} for i in range(3)])
    args = ["ppl-filter", "-w", ws, "--in", "docs", "--set", "backend=kenlm",
            "--set", f"kenlm_model={tmp_path / 'lm.bin'}", "--set", "max_ppl=1.5"]
    r = llmkit(*args)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "ppl-filter: no row kept from 3 rows" in r.output
    assert "3 × ppl_above_threshold (first: id 'd0')" in " ".join(r.output.split())
    assert not (ws / "filtered").exists()
    assert llmkit(*args, "--set", "allow_empty=true").exit_code == 0


def test_a_kenlm_file_given_as_model_says_how_to_use_it(tmp_path):
    from llmkit.data.ppl_filter import PplFilterConfig, scoring_input
    from llmkit.core.workspace import Workspace

    lm = tmp_path / "lm.bin"
    lm.write_bytes(b"kenlm")
    with pytest.raises(UserError, match=r"--set backend=kenlm --set kenlm_model=.*lm.bin"):
        scoring_input(Workspace(tmp_path / "ws"), PplFilterConfig(), str(lm))
