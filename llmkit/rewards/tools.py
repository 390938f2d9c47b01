"""Tools a policy may call during a GRPO/RLOO rollout (`--set tools=calculator,my_tools.py:search,lookup`).

A tool is a Python function called with the keyword arguments the model writes; what it returns
(a string, else its JSON or `str`) is the text the model reads next. `tools` names built-ins
(`calculator`) and `FILE.py:FUNCTION` — a bare name after a file is another function of that file
(`my_tools.py:search,lookup`).

The call markup is Qwen2.5's and Qwen3's (also llmkit's own models'): the reply holds
`<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`, one block per call; Qwen3.5's
`<tool_call><function=NAME><parameter=P>VALUE</parameter></function></tool_call>` is read too
(its values as strings). A call never
raises out of here: bad JSON, an unknown tool, an exception inside the tool or a call that runs
past `timeout` seconds all become the tool's text (`error: ...`), which the model reads like any
result, and are counted. A timed-out call is abandoned in its thread (a Python function cannot
be killed from outside its process): a tool that may hang should bound its own work.
"""

from __future__ import annotations

import ast
import importlib
import json
import operator
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from llmkit.errors import ConfigError
from llmkit.rewards.plugins import function_of_file

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)
MAX_RESULT_CHARS = 1000  # a longer result is cut: it would crowd the rollout's window
BUILTIN_TOOLS = {"calculator": "llmkit.rewards.tools:calculator"}


def tool_names(spec: str) -> list[str]:
    """`calculator,a.py:f,g` -> ["calculator", "a.py:f", "a.py:g"]; an unknown bare name is a ConfigError."""
    names, file = [], None
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if ":" in item:
            file = item.rsplit(":", 1)[0]
            names.append(item)
        elif item in BUILTIN_TOOLS:
            names.append(item)
        elif file is not None:
            names.append(f"{file}:{item}")
        else:
            raise ConfigError(f"tools: {item!r} is neither a built-in tool ({', '.join(BUILTIN_TOOLS)}) "
                              "nor FILE.py:FUNCTION")
    return list(dict.fromkeys(names))


def tool_files(spec: str) -> list[Path]:
    """The Python files the tools come from (inputs of the run)."""
    return list(dict.fromkeys(Path(n.rsplit(":", 1)[0]) for n in tool_names(spec) if ":" in n))


def load_tools(spec: str) -> dict[str, Callable]:
    """{the name a model calls it by (the function's name): the function} of every tool `spec` names."""
    tools = {}
    for name in tool_names(spec):
        if name in BUILTIN_TOOLS:
            module, function = BUILTIN_TOOLS[name].split(":")
            tools[name] = getattr(importlib.import_module(module), function)
            continue
        file, function = name.rsplit(":", 1)
        tools[function] = function_of_file(Path(file), function, kind="tool")
    return tools


# ---- calls --------------------------------------------------------------------------------------

def parse_tool_calls(reply: str) -> list[str]:
    """The text inside each <tool_call>…</tool_call> of `reply`, in order."""
    return TOOL_CALL.findall(reply)


@dataclass
class ToolResult:
    name: str | None  # the tool called (None: the call could not be read)
    text: str  # what the model reads
    ok: bool  # False: an error of the call or the tool, its reason in `text`


def run_tool_call(call: str, tools: dict[str, Callable], timeout: float) -> ToolResult:
    """Run one call (the JSON inside a <tool_call> block); every failure becomes an `error: ...` result."""
    function = _XML_FUNCTION.fullmatch(call.strip())
    if function:  # Qwen3.5's form: <function=NAME><parameter=P>VALUE</parameter>…</function>
        parsed = {"name": function[1], "arguments": dict(_XML_PARAMETER.findall(function[2]))}
    else:
        try:
            parsed = json.loads(call)
        except json.JSONDecodeError as e:
            return ToolResult(None, f"error: the tool call is not JSON ({e.msg})", False)
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return ToolResult(None, 'error: a tool call is {"name": ..., "arguments": {...}}', False)
    name, arguments = parsed["name"], parsed.get("arguments") or {}
    if name not in tools:
        return ToolResult(name, f"error: no tool named {name!r} (tools: {', '.join(tools)})", False)
    if not isinstance(arguments, dict):
        return ToolResult(name, "error: arguments must be a JSON object", False)
    outcome: dict = {}

    def call_it():
        try:
            outcome["value"] = tools[name](**arguments)
        except Exception as e:  # noqa: BLE001 - the tool's failure is the model's to read
            outcome["error"] = f"{type(e).__name__}: {e}"

    worker = threading.Thread(target=call_it, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return ToolResult(name, f"error: timed out after {timeout:g}s", False)
    if "error" in outcome:
        return ToolResult(name, f"error: {outcome['error']}"[:MAX_RESULT_CHARS], False)
    value = outcome.get("value")
    if not isinstance(value, str):
        try:
            value = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            value = str(value)
    return ToolResult(name, value[:MAX_RESULT_CHARS], True)


# ---- the built-in calculator ----------------------------------------------------------------------

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
              ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-", "（": "(", "）": ")", "^": "**"})
MAX_EXPONENT = 100  # 10**10**10 would run for ever
MAX_DIGITS = 60


def calculator(expression: str) -> str:
    """The value of an arithmetic expression: numbers, + - * / // % ** (^), parentheses; × and ÷ too.
    An integral value is written without a decimal point, another to 10 significant digits."""
    tree = ast.parse(str(expression).translate(_SYMBOLS).strip(), mode="eval")
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.10g}"


def _evaluate(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large")
        value = _OPERATORS[type(node.op)](left, right)
        if isinstance(value, int) and len(str(abs(value))) > MAX_DIGITS:
            raise ValueError("the result is too large")
        return value
    raise ValueError(f"not arithmetic: {ast.unparse(node)}")
