import pytest

from llmkit.errors import ConfigError, UserError
from llmkit.rewards.tools import calculator, load_tools, parse_tool_calls, run_tool_call, tool_names


def test_calculator_computes_arithmetic_and_refuses_the_rest():
    assert calculator("23*47") == "1081" and calculator("(2 + 3) × 4 ÷ 2") == "10"
    assert calculator("7/3") == "2.333333333" and calculator("2^10") == "1024" and calculator("-3*-3") == "9"
    for bad in ("__import__('os')", "x + 1", "9**9**9", "'a' * 3"):
        with pytest.raises((ValueError, SyntaxError)):
            calculator(bad)


def test_tool_names_and_user_files(tmp_path):
    assert tool_names("calculator, a.py:f,g") == ["calculator", "a.py:f", "a.py:g"]
    with pytest.raises(ConfigError, match="abacus"):
        tool_names("abacus")
    (tmp_path / "mine.py").write_text("def shout(text):\n    return text.upper()\n")
    tools = load_tools(f"calculator,{tmp_path / 'mine.py'}:shout")
    assert set(tools) == {"calculator", "shout"} and tools["shout"]("hi") == "HI"
    with pytest.raises(UserError, match="no function 'whisper'"):
        load_tools(f"{tmp_path / 'mine.py'}:whisper")


def test_a_call_is_parsed_and_every_failure_becomes_text():
    reply = 'Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
    [call] = parse_tool_calls(reply)
    tools = {"calculator": calculator, "listing": lambda: [1, 2]}
    assert run_tool_call(call, tools, 1.0).text == "6"
    assert run_tool_call('{"name": "listing"}', tools, 1.0).text == "[1, 2]"  # JSON of a non-string
    failures = {'{"name": "calculator", "arguments": {"expression": "1/0"}}': "error: ZeroDivisionError",
                '{"name": "abacus"}': "error: no tool named 'abacus'", "{nope": "error: the tool call is not JSON",
                '{"name": "calculator", "arguments": [1]}': "error: arguments must be a JSON object"}
    for text, error in failures.items():
        result = run_tool_call(text, tools, 1.0)
        assert not result.ok and result.text.startswith(error)


def test_qwen35_calls_and_its_template_tool_turn():
    from pathlib import Path

    from llmkit.tokenizers.chat_template import render_chat
    from llmkit.train.tool_rollouts import tool_turn_ids

    call = "<function=calculator>\n<parameter=expression>\n23*47\n</parameter>\n</function>"
    assert run_tool_call(call, {"calculator": calculator}, 1.0).text == "1081"

    class Characters:  # a tokenizer of the Qwen3.5 template: one id per character, <|im_end|> one id
        chat_template = (Path(__file__).parents[1] / "assets" / "qwen35_chat_template.jinja").read_text()
        stop_ids = [-1]

        def encode_chat(self, messages, add_generation_prompt=False):
            text = render_chat(self.chat_template, messages, add_generation_prompt)[0]
            ids = []
            for i, part in enumerate(text.split("<|im_end|>")):
                ids += ([-1] if i else []) + [ord(c) for c in part]
            return ids, []

    inserted = tool_turn_ids(Characters(), [{"role": "user", "content": "What is 23*47?"}],
                             f"<tool_call>\n{call}\n</tool_call>", ["1081"])
    # the template renders the calling turn with an empty <think> block only once it is not the
    # last: counting end-of-turn tokens still cuts right after it
    assert "".join("<|im_end|>" if i == -1 else chr(i) for i in inserted) == (
        "\n<|im_start|>user\n<tool_response>\n1081\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n")
