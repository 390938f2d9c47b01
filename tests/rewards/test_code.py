import subprocess
import tempfile
import time

import pytest

from llmkit.errors import ConfigError
from llmkit.rewards.code import SandboxLimits, code_reward, extract_code, run_in_sandbox, split_tests

FAST = SandboxLimits(wall_s=10.0, cpu_s=1, memory_mb=512, file_mb=1, processes=8, workers=2)
ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(autouse=True)
def scratch_parent(tmp_path, monkeypatch):
    """Scratch folders made under tmp_path/tmp, so a test can see that none is left behind."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    yield tmp_path / "tmp"
    assert list((tmp_path / "tmp").iterdir()) == []


def sandbox_processes() -> int:
    return sum("-I -B -c" in line for line in subprocess.run(
        ["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines())


def test_the_pass_rate_counts_asserts_or_list_items():
    assert run_in_sandbox(ADD, "assert add(1, 2) == 3\nassert add(2, 2) == 5\nx = 1\nassert add(x, 0) == 1",
                          FAST).score == pytest.approx(2 / 3)
    outcome = run_in_sandbox(ADD, ["assert add(1, 2) == 3", "assert add(2, 2) == 5"], FAST)
    assert (outcome.score, outcome.reason, outcome.passed, outcome.total) == (0.5, "failed", 1, 2)
    assert run_in_sandbox(ADD, ["assert add(1, 2) == 3"], FAST).reason == "passed"
    # setup that raises fails the asserts after it, not those before
    assert run_in_sandbox(ADD, "assert add(1, 1) == 2\nraise ValueError\nassert add(1, 2) == 3",
                          FAST).score == 0.5


def test_test_units():
    assert split_tests("import math\nassert math.pi > 3") == [("import math", False), ("assert math.pi > 3", True)]
    assert split_tests("check(add)") == [("check(add)", True)]
    assert split_tests(["assert f()", "", None]) == [("assert f()", True)]
    assert split_tests("") is None and split_tests(None) is None and split_tests([]) is None


def test_the_code_is_the_fenced_python_block():
    assert extract_code("Here:\n```python\nx = 1\n```\nand\n```\ny = 2\n```") == "x = 1\n"
    assert extract_code("```\ny = 2\n```") == "y = 2\n"
    assert extract_code("x = 3") == "x = 3"
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # cut off
    assert extract_code([{"role": "assistant", "content": "```py\nz = 1\n```"}]) == "z = 1\n"


def test_a_syntax_error_scores_zero_with_its_reason():
    outcome = run_in_sandbox("def add(a, b) return a", "assert add(1, 2) == 3", FAST)
    assert (outcome.score, outcome.reason) == (0.0, "syntax_error")


def test_an_infinite_loop_is_killed_at_the_wall_limit():
    start = time.monotonic()
    outcome = run_in_sandbox("while True:\n    pass", "assert True", SandboxLimits(wall_s=1.0, cpu_s=30))
    assert (outcome.score, outcome.reason) == (0.0, "timeout")
    # well before the 30 s CPU limit (the margin is for a loaded machine's slow start)
    assert time.monotonic() - start < 15 and sandbox_processes() == 0


def test_a_fork_bomb_is_refused_and_its_processes_bounded_and_killed():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except BaseException:\n        pass\n"
    outcome = run_in_sandbox(bomb, "assert True", FAST)
    assert (outcome.score, outcome.reason) == (0.0, "process")
    # beneath the audit hook: the process-group kill at the wall limit ends every process of
    # the bomb before run_in_sandbox returns (RLIMIT_NPROC bounds it too, except for root, whom
    # the kernel exempts; the sleep keeps an unbounded root bomb small)
    slow_bomb = bomb.replace("pass", "import time; time.sleep(0.3)")
    outcome = run_in_sandbox(slow_bomb, "assert True", SandboxLimits(wall_s=0.5, processes=8, audit=False))
    assert (outcome.score, outcome.reason) == (0.0, "timeout")
    assert sandbox_processes() == 0


def test_a_10_gb_allocation_fails_as_memory():
    outcome = run_in_sandbox("x = bytearray(10 * 1024 ** 3)", "assert True", FAST)
    assert (outcome.score, outcome.reason) == (0.0, "memory")


def test_a_network_connect_is_refused():
    code = "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)"
    outcome = run_in_sandbox(code, "assert True", FAST)
    assert (outcome.score, outcome.reason) == (0.0, "network")
    # beneath the audit hook: a network namespace without interfaces, where the kernel allows one
    outcome = run_in_sandbox(code, "assert True", SandboxLimits(wall_s=5.0, audit=False))
    if not outcome.namespaces:
        pytest.skip("no user/network namespace on this machine: the audit hook is the only layer")
    assert (outcome.score, outcome.reason) == (0.0, "network")


def test_a_write_outside_the_scratch_folder_is_refused_even_when_the_code_swallows_it(tmp_path):
    target = tmp_path / "escape.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')",
                 f"try:\n    open({str(target)!r}, 'w')\nexcept BaseException:\n    pass\nok = 1",
                 f"import os\ntry:\n    os.remove({__file__!r})\nexcept BaseException:\n    pass"):
        outcome = run_in_sandbox(code, "assert True", FAST)
        assert (outcome.score, outcome.reason) == (0.0, "forbidden_write"), code
    assert not target.exists()
    # its own scratch folder is writable (and removed afterwards: the fixture checks)
    scratch_code = "open('a.txt', 'w').write('x')\nimport os\nos.mkdir('d')\nREAD = open('a.txt').read()"
    assert run_in_sandbox(scratch_code, "assert READ == 'x'", FAST).reason == "passed"


def test_reads_outside_the_interpreter_and_the_scratch_folder_are_refused():
    outcome = run_in_sandbox(f"open({__file__!r}).read()", "assert True", FAST)
    assert (outcome.score, outcome.reason) == (0.0, "forbidden_read")
    assert run_in_sandbox("import json, yaml\nN = json.dumps(1)", "assert N == '1'", FAST).reason == "passed"


def test_a_flood_of_output_stops_at_the_file_limit():
    outcome = run_in_sandbox("while True:\n    print('x' * 10000)", "assert True", FAST)
    assert (outcome.score, outcome.reason) == (0.0, "output")


def test_the_caller_goes_on_and_gets_each_reason():
    completions = ["```python\n" + ADD + "```", "while True: pass", "import os\nos.fork()",
                   "x = bytearray(10 * 1024 ** 3)", "import socket\nsocket.create_connection(('1.1.1.1', 80))",
                   "open('/tmp/llmkit-escape', 'w')", "def add(a, b) return", ADD]
    tests = [["assert add(1, 2) == 3"]] * 7 + [None]
    logged = {}
    rewards = code_reward(["p"] * 8, completions, tests=tests, limits=FAST, log_extra=logged.__setitem__,
                          log_metric=logged.__setitem__)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None]
    assert logged["code_reason"] == ["passed", "timeout", "process", "memory", "network", "forbidden_write",
                                     "syntax_error", "no_tests"]
    assert logged["code/timeout"] == pytest.approx(1 / 8)
    with pytest.raises(ConfigError, match="'tests' or 'test_list' or 'test'"):
        code_reward(["p"], ["x = 1"], answer=["1"])
