import json

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.errors import ConfigError
from llmkit.eval.long_context import (PHRASES, TESTS, Haystack, LongContextConfig, build_sample,
                                      score_reply)
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

CFG = LongContextConfig(lengths=[600], max_new_tokens=8, keys=3, hops=3)


def sample(tok, test="single_key", lang="en", length=600, depth=0.5, index=0, cfg=CFG, chat=False):
    return build_sample(test, lang, length, depth, index, cfg, Haystack(lang, tok), chat)


@pytest.mark.parametrize("test", TESTS)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_sample_is_the_same_for_the_same_seed_and_fits_its_length(tok, test, lang):
    a, b = sample(tok, test, lang), sample(tok, test, lang)
    assert a.ids == b.ids and a.references == b.references
    assert 600 - 8 - 80 <= len(a.ids) <= 600 - 8  # the prompt leaves the reply its tokens, nearly all used
    text = tok.decode(a.ids)
    assert all(r in text for r in a.references) or test == "needle"
    other = sample(tok, test, lang, cfg=LongContextConfig(lengths=[600], max_new_tokens=8, keys=3, hops=3, seed=1))
    assert other.ids != a.ids  # the seed draws another haystack and needles


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_the_needle_sits_where_the_depth_says(tok, depth):
    s = sample(tok, "needle", "en", length=600, depth=depth)
    assert abs(s.depth_actual - depth) < 0.08  # one haystack line either side
    text = tok.decode(s.ids)
    fact = text.index("The best thing to do in")
    needle = len(text[fact:].split("\n", 1)[0])
    start, end = text.index("afterwards.") + len("afterwards."), text.rindex("What is the best")
    assert abs((fact - start) / (end - start - needle) - depth) < 0.1  # in characters of haystack


def test_a_chain_keeps_its_order_and_distractors_differ_from_the_asked_key(tok):
    s = sample(tok, "variable_tracking", "en", depth=0.25)
    text = tok.decode(s.ids)
    first, *rest = s.references
    assert text.index(f"VAR {first} =") < min(text.index(f"VAR {v} = VAR") for v in rest)
    m = sample(tok, "multi_key", "zh", depth=0.0)
    assert tok.decode(m.ids).count("特殊魔法数字之一") == 3


def test_scoring_counts_the_references_a_reply_holds():
    assert score_reply(" 4821937.", ["4821937"], chain=False) == (1.0, True)
    assert score_reply("48219370", ["4821937"], chain=False) == (0.0, False)  # a longer number is not it
    assert score_reply("It is 4821937, I think", ["4821937"], chain=False) == (1.0, False)
    assert score_reply("坐老电车。", ["坐老电车"], chain=False) == (1.0, True)
    assert score_reply("QXKRM, BTWZA", ["QXKRM", "BTWZA", "LMNOP"], chain=True) == (2 / 3, False)
    assert score_reply("QXKRM BTWZA LMNOP", ["QXKRM", "BTWZA", "LMNOP"], chain=True) == (1.0, True)


def test_bad_settings_name_their_key(tok):
    for kw, key in ((dict(tests=["haystack"]), "long.tests"), (dict(depths=[1.5]), "long.depths"),
                    (dict(langs=["fr"]), "long.langs"), (dict(samples=0), "long.samples")):
        with pytest.raises(ConfigError, match=key):
            LongContextConfig(**kw)
    with pytest.raises(ConfigError, match="long.lengths"):
        sample(tok, length=40)  # no room for a haystack


def test_eval_long_writes_cells_per_length_and_depth_and_a_heat_map(tmp_path, tok):
    root = tmp_path / "ws"
    write_checkpoint_run(root, "pretrain", tiny_model(tok.vocab_size, seed=1, max_seq_len=600), tok)
    r = CliRunner().invoke(build_app(), [
        "eval", "-w", str(root), "--from", "pretrain", "--tasks", "long", "--set", "long.lengths=500,700",
        "--set", "long.depths=0,1", "--set", "long.samples=1", "--set", "long.max_new_tokens=4",
        "--set", "long.tests=needle,variable_tracking", "--set", "long.hops=2"])
    assert r.exit_code == 0, r.output
    out = root / "eval" / "pretrain"
    results = json.loads((out / "results.json").read_text())["long"]
    cells = results["cells"]
    assert {(c["test"], c["lang"], c["length"], c["depth"]) for c in cells} == {
        (t, lang, n, d) for t in ("needle", "variable_tracking") for lang in ("en", "zh")
        for n in (500, 700) for d in (0.0, 1.0)}
    assert {c["beyond_window"] for c in cells if c["length"] == 700} == {True}  # past max_seq_len=600
    assert all(0 <= c["score"] <= 1 and c["samples"] == 1 for c in cells)
    assert len((out / "long-context.jsonl").read_text().splitlines()) == 16
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert "long/needle/zh" in stats and "long/length700" in stats
    r = CliRunner().invoke(build_app(), ["report", "-w", str(root), "eval/pretrain"])
    assert r.exit_code == 0, r.output
    report = root / "report" / "eval-pretrain"
    assert (report / "long-context-pretrain.png").is_file()
    assert "long-context-pretrain.png" in (report / "summary.md").read_text()
