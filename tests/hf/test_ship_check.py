"""`llmkit export --format gguf --check`: the file through llama.cpp's chat path. A tiny model that
learnt four chats (their replies end at <|end|>) passes; a random model that never ends a reply,
a file whose template lacks the end token and a file whose eos/eot name another token fail with
exit 1 naming what failed, and leave no artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import llmkit.hf.gguf_export as gguf_export
from llmkit.cli.app import build_app
from tests.train.posttrain_fixtures import make_tokenizer, memorizing_model, tiny_model, write_checkpoint_run

pytestmark = pytest.mark.usefixtures("one_thread")
CHATS = [("What is 12+34?", "46"), ("计算 20+22 等于", "42"), ("Reverse: abcd", "dcba"), ("What is 55+11?", "66")]


def invoke(*args):
    return CliRunner().invoke(build_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A workspace with `chat` (a model that learnt CHATS' replies and their end of turn) and
    `random` (which never ends one), and the prompts file."""
    root = tmp_path_factory.mktemp("ship")
    tok = make_tokenizer(root / "tok")
    sequences = [tok.encode_chat([{"role": "user", "content": q}, {"role": "assistant", "content": a}])[0]
                 for q, a in CHATS]
    write_checkpoint_run(root / "ws", "chat", memorizing_model(tok, sequences, steps=120), tok)
    write_checkpoint_run(root / "ws", "random", tiny_model(tok.vocab_size, seed=3, init_std=0.3), tok)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": q}) + "\n" for q, _ in CHATS))
    return root / "ws", prompts


def export(ws: Path, run: str, prompts: Path, *extra):
    return invoke("export", "--from", run, "--format", "gguf", "--quant", "f16", "-w", ws, "--out", f"gguf-{run}",
                  "--check", "--set", f"ship_prompts={prompts}", "--set", "ship_max_tokens=16",
                  "--set", "probe=false", *extra)


def test_without_the_binding_the_check_is_skipped_with_a_note(monkeypatch, tmp_path):
    import sys

    from llmkit.hf.ship_check import ship_check, summary

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    record = ship_check(tmp_path / "none.gguf", None, None, "f16")
    assert record["passed"] is None and "not installed" in record["skipped"]
    assert summary(record).startswith("skipped")


def test_a_model_that_ends_its_replies_passes_and_the_manifest_says_so(runs):
    pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    ws, prompts = runs
    r = export(ws, "chat", prompts)
    assert r.exit_code == 0, r.output
    assert "ship check" in r.output and "passed" in r.output
    check = json.loads((ws / "gguf-chat" / "manifest.json").read_text())["stats"]["ship_check"]
    assert check["passed"] and check["failures"] == []
    assert check["stops"] == check["template_equal"] == check["replies_equal"] == len(CHATS)
    assert check["end_of_turn"] == "<|end|>" and max(check["reply_tokens"]) < 16
    record = json.loads((ws / "gguf-chat" / "llmkit_export.json").read_text())["ship_check"]
    assert record["differing"] == []


def test_a_model_that_never_ends_a_reply_fails_with_exit_1(runs):
    pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    ws, prompts = runs
    r = export(ws, "random", prompts)
    assert r.exit_code == 1, r.output
    assert "did not stop within 16 tokens" in r.output and "eot <|end|>" in r.output
    assert "4 of them run past the limit in llmkit's own model too" in r.output  # the model's, not the file's
    assert "FAILED: 0/4 replies stop at <|end|>, template 4/4" in r.output
    assert not (ws / "gguf-random").exists()  # no artifact that make would take as shipped


def planted(monkeypatch, breaks):
    real = gguf_export.gguf_vocab

    def broken(tokenizer, vocab_size):
        vocab = real(tokenizer, vocab_size)
        breaks(vocab, tokenizer)
        return vocab

    monkeypatch.setattr(gguf_export, "gguf_vocab", broken)


def test_a_template_without_the_end_token_fails_naming_it(runs, monkeypatch):
    pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    ws, prompts = runs

    def drop_end(vocab, tokenizer):
        vocab.chat_template = vocab.chat_template.replace("'<|end|>'", "'\\n'")

    planted(monkeypatch, drop_end)
    r = export(ws, "chat", prompts, "--force")
    assert r.exit_code == 1, r.output
    assert "renders prompt 1 differently" in r.output
    assert "writes no end-of-turn token after an assistant reply" in r.output


def test_eos_and_eot_naming_another_token_fail_as_never_stopping(runs, monkeypatch):
    """The commonest "never stops in Ollama": the file's end-of-generation ids are not the token
    the model ends its turns with (here <|end|> renamed, so that llama.cpp does not find it by name)."""
    pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    ws, prompts = runs

    def other_eos(vocab, tokenizer):
        end = tokenizer.end_of_turn_id
        vocab.tokens[end] = "<|turn_done|>"
        vocab.chat_template = vocab.chat_template.replace("<|end|>", "<|turn_done|>")
        vocab.special_ids["eot"] = vocab.special_ids["eos"]

    planted(monkeypatch, other_eos)
    r = export(ws, "chat", prompts, "--force")
    assert r.exit_code == 1, r.output
    assert "did not stop within 16 tokens" in r.output and "0 of them run past the limit" in r.output
    assert "ends a reply with <|turn_done|>" in r.output and "not among the file's end-of-generation tokens" in r.output


def test_ship_check_needs_a_gguf_file(runs):
    ws, _ = runs
    r = invoke("export", "--from", "chat", "-w", ws, "--set", "ship_check=true")
    assert r.exit_code == 2 and "add --format gguf" in r.output
