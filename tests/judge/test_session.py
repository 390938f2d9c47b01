"""`llmkit judge --prepare`: every model's reply to every prompt, paired into items; a session that
holds judgements is never rebuilt without --force."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.judge.journal import JOURNAL_FILE, Journal
from llmkit.judge.session import read_items

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["What is 12+34?", "Reverse: abcd", "计算 11+22 等于", "What is 40+41?"]


def llmkit(*args):
    return CliRunner().invoke(build_app(), [str(a) for a in args])


def test_prepare_pairs_each_models_own_replies_and_keeps_judged_sessions(tmp_path, tok):
    import llmkit as api
    from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run, write_dataset

    ws = tmp_path / "ws"
    for seed, name in enumerate(("modelalpha", "modelbeta", "modelgamma")):
        # an untied head is drawn from the seed, so each model replies in its own way
        write_checkpoint_run(ws, name, tiny_model(tok.vocab_size, seed=seed, tie_embeddings=False), tok)
    write_dataset(ws, "prompts", [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)])
    args = ["judge", "--prepare", "-w", ws, "--from", "modelalpha,modelbeta,modelgamma", "--prompts", "prompts",
            "--out", "judged", "--set", "max_prompts=3", "--set", "generation.max_new_tokens=4"]
    assert llmkit(*args).exit_code == 0
    items = read_items(ws / "judged")
    assert len(items) == 3 * 3 and {i["prompt"] for i in items} == set(PROMPTS[:3])
    replies = {m: api.generate(*api.load(ws / m), PROMPTS[:3], max_new_tokens=4, greedy=True)
               for m in ("modelalpha", "modelbeta", "modelgamma")}
    assert len({tuple(r) for r in replies.values()}) == 3  # they differ: the pairing is checked
    for item in items:
        for side in ("left", "right"):
            assert item[side] == replies[item[f"{side}_model"]][PROMPTS.index(item["prompt"])]
        assert "model" not in item["id"]
    assert "up to date" in llmkit(*args).output
    as_earlier_llmkit_wrote_it(ws / "judged", "decode")
    assert "up to date" in llmkit(*args).output  # a generation setting added since, at its default

    journal = Journal(ws / "judged" / JOURNAL_FILE)
    journal.append({"rater": "ann", "item": items[0]["id"], "choice": "left"})
    journal.close()
    changed = llmkit(*args[:-1], "generation.max_new_tokens=5")
    assert changed.exit_code == 2 and "holds 1 judgements" in changed.output and "--force" in changed.output
    assert (ws / "judged" / JOURNAL_FILE).stat().st_size > 0
    assert llmkit(*args[:-1], "generation.max_new_tokens=5", "--force").exit_code == 0
    assert not (ws / "judged" / JOURNAL_FILE).exists()


def as_earlier_llmkit_wrote_it(session, generation_key: str) -> None:
    """The session's manifest as an llmkit without the setting generation.<key> wrote it."""
    import json

    from llmkit.core.fingerprints import fingerprint_of

    path = session / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["config"]["generation"][generation_key]
    manifest["fingerprint"] = fingerprint_of("judge", manifest["config"], [i["fingerprint"] for i in manifest["inputs"]])
    path.write_text(json.dumps(manifest))


def test_models_and_actions_are_checked_by_name(tmp_path):
    assert "two or more different" in llmkit("judge", "--prepare", "-w", tmp_path, "--from", "sft",
                                             "--prompts", "p").output
    result = llmkit("judge", "--export", "--prepare", "-w", tmp_path)
    assert result.exit_code == 2 and "--prepare, --from or --prompts" in result.output
    result = llmkit("judge", "--export", "-w", tmp_path)
    assert result.exit_code == 2 and "no artifact 'judge'" in result.output
