"""The Modelfile beside a GGUF file: its TEMPLATE, run by Go's own text/template as Ollama runs it
(a model's SYSTEM first when a chat has none, `.System` the system messages, `.Messages` all of
them), renders sample chats as the jinja template renders them, for llmkit's own template, ChatML
(Qwen2.5, Qwen3, SmolLM2, each with its default system prompt or none) and Llama 3. The rendering
test needs `go` (skipped without it); the Modelfile of an exported file does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.hf.ollama import go_template, modelfile, turn_strings
from llmkit.tokenizers.base import CHAT_TEMPLATE
from llmkit.tokenizers.chat_template import render_chat
from tests.tokenizers.test_tokenizer_json import LLAMA3_TEMPLATE, QWEN3_TEMPLATE, QWEN25_TEMPLATE
from tests.train.posttrain_fixtures import make_tokenizer, tiny_model, write_checkpoint_run

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEMPLATES = {"llmkit": ("{{ bos_token }}" + CHAT_TEMPLATE, {"bos_token": "<s>", "eos_token": "</s>"}),
             "qwen2.5": (QWEN25_TEMPLATE, {"eos_token": "<|im_end|>"}),
             "qwen3": (QWEN3_TEMPLATE, {"eos_token": "<|im_end|>"}),
             "smollm2": (SMOLLM2_TEMPLATE, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}),
             "llama3": (LLAMA3_TEMPLATE, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})}
CHATS = [[{"role": "user", "content": "Hello there"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
         [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
          {"role": "user", "content": "And 3+3?"}],
         [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "a"},
          {"role": "assistant", "content": "b"}, {"role": "user", "content": "你好，世界"}]]

# Ollama's rendering (server/prompt.go, template/template.go) reduced to what a Modelfile template sees
OLLAMA_GO = """package main

import (
	"encoding/json"
	"os"
	"strings"
	"text/template"
)

type Msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type Case struct {
	Template string `json:"template"`
	System   string `json:"system"`
	Messages []Msg  `json:"messages"`
}

func main() {
	var cases []Case
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		panic(err)
	}
	out := []string{}
	for _, c := range cases {
		msgs := c.Messages
		if len(msgs) > 0 && msgs[0].Role != "system" && c.System != "" {
			msgs = append([]Msg{{Role: "system", Content: c.System}}, msgs...)
		}
		system := []string{}
		for _, m := range msgs {
			if m.Role == "system" {
				system = append(system, m.Content)
			}
		}
		var b strings.Builder
		t := template.Must(template.New("modelfile").Parse(c.Template))
		if err := t.Execute(&b, map[string]any{"System": strings.Join(system, "\\n\\n"), "Messages": msgs}); err != nil {
			panic(err)
		}
		out = append(out, b.String())
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
"""


def ollama_render(tmp_path: Path, cases: list[dict]) -> list[str]:
    source = tmp_path / "ollama_render.go"
    source.write_text(OLLAMA_GO)
    env = {**os.environ, "GOCACHE": str(tmp_path / "gocache"), "GOPATH": str(tmp_path / "gopath"), "GOFLAGS": "-mod=mod"}
    r = subprocess.run(["go", "run", str(source)], input=json.dumps(cases), capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed (apt-get install golang-go)")
def test_the_go_template_renders_chats_as_the_jinja_template(tmp_path):
    cases, expected = [], []
    for name, (template, special) in TEMPLATES.items():
        strings = turn_strings(template, special)
        assert strings is not None, name
        for chat in CHATS:
            cases.append({"template": go_template(strings), "system": strings["default_system"], "messages": chat})
            text = render_chat(template, chat, True, special_tokens=special)[0]
            expected.append((name, text[len(strings["bos"]):]))  # llama.cpp adds the bos itself
    for (name, want), got in zip(expected, ollama_render(tmp_path, cases)):
        assert got == want, name


def test_the_default_system_prompt_becomes_system():
    strings = turn_strings(*TEMPLATES["smollm2"])
    assert strings["default_system"] == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    # SmolLM2's bos is <|im_start|>, which its template never writes as bos_token: the turns keep it
    assert strings["bos"] == "" and strings["system_prefix"] == "<|im_start|>system\n"
    assert turn_strings(*TEMPLATES["llmkit"])["bos"] == "<s>"
    text, templated = modelfile("model-q8_0.gguf", *TEMPLATES["smollm2"], stops=["<|im_end|>", "<|im_end|>"])
    assert templated and 'SYSTEM """You are a helpful AI assistant named SmolLM' in text
    assert text.count('PARAMETER stop "<|im_end|>"') == 1 and "FROM ./model-q8_0.gguf" in text
    assert turn_strings(*TEMPLATES["llama3"])["default_system"] == ""


def test_a_template_whose_turns_do_not_come_apart_gets_no_template():
    odd = "{% for m in messages %}{{ m['content'] }}{% if loop.index0 == 1 %}!{% endif %}|{% endfor %}"
    text, templated = modelfile("m.gguf", odd, {}, stops=["|"])
    assert not templated and "TEMPLATE" not in text and 'PARAMETER stop "|"' in text


def test_export_writes_the_modelfile_beside_the_file(tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    write_checkpoint_run(tmp_path / "ws", "run", tiny_model(tok.vocab_size), tok)
    r = CliRunner().invoke(build_app(), ["export", "--from", "run", "--format", "gguf", "--quant", "q8_0",
                                         "-w", str(tmp_path / "ws"), "--set", "probe=false"])
    assert r.exit_code == 0, r.output
    folder = tmp_path / "ws" / "export" / "gguf-q8_0"
    text = (folder / "Modelfile").read_text()
    assert "FROM ./model-q8_0.gguf" in text and 'PARAMETER stop "<|end|>"' in text
    assert 'TEMPLATE """' in text and '{{ "<|user|>" }}{{ .Content }}{{ "<|end|>" }}' in text
    assert json.loads((folder / "llmkit_export.json").read_text())["modelfile_template"] is True
