import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from llmkit.core import aot

KERNELS = textwrap.dedent("""
    import numpy as np
    from numba import njit

    from llmkit.data.dedup.shingles import WORDS


    @njit(cache=True)
    def step(x):
        return x * np.uint64(3) + np.uint64(WORDS + 1)


    @njit(cache=True)
    def total(values, start):
        out = start
        for v in values:
            out = step(out ^ v)
        return out
""")
SIGNATURES = {"total": "u8(u8[::1], u8)"}


@pytest.fixture
def kernel_module(tmp_path, monkeypatch):
    """A package `tinypkg` with a kernel module `tinypkg.kernels`, importable by this process."""
    package = tmp_path / "tinypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package / "kernels.py"
    for name in [m for m in sys.modules if m.startswith("tinypkg")]:
        del sys.modules[name]


def test_compiled_kernels_give_the_jit_results_in_a_process_without_numba(kernel_module):
    values = np.arange(1, 1000, dtype=np.uint64)
    jit = aot.just_in_time("tinypkg.kernels")
    compiled = aot.load("tinypkg.kernels", SIGNATURES, what="the test kernels")
    assert compiled is not jit and compiled.__file__.endswith(".so")
    assert compiled.total(values, np.uint64(7)) == jit.total(values, np.uint64(7))

    code = ("import sys, numpy as np; from llmkit.core import aot; "
            f"k = aot.load('tinypkg.kernels', {SIGNATURES!r}, what='x'); "
            "print(k.total(np.arange(1, 1000, dtype=np.uint64), 7), 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ,
                              "PYTHONPATH": f"{kernel_module.parents[1]}:{_root()}"},
                         check=True).stdout.split()
    assert out == [str(jit.total(values, np.uint64(7))), "False"]

    # an edit builds a new module and deletes the old one
    kernel_module.write_text(KERNELS.replace("np.uint64(3)", "np.uint64(5)"))
    rebuilt = aot.load("tinypkg.kernels", SIGNATURES, what="the test kernels")
    assert rebuilt.__file__ != compiled.__file__
    assert not (kernel_module.parent / "__pycache__" / compiled.__file__.split("/")[-1]).exists()


def test_the_module_name_follows_the_source_signatures_and_imported_constants(kernel_module,
                                                                        monkeypatch):
    from llmkit.data.dedup import shingles

    first = aot.compiled_path("tinypkg.kernels", SIGNATURES)
    assert aot.compiled_path("tinypkg.kernels", SIGNATURES) == first
    assert first.parent == kernel_module.parent / "__pycache__"
    monkeypatch.setattr(shingles, "WORDS", shingles.WORDS + 7)
    assert aot.compiled_path("tinypkg.kernels", SIGNATURES) != first
    monkeypatch.undo()
    assert aot.compiled_path("tinypkg.kernels", {**SIGNATURES, "step": "u8(u8)"}) != first
    kernel_module.write_text(KERNELS + "\n# a comment\n")
    assert aot.compiled_path("tinypkg.kernels", SIGNATURES) != first


def test_a_failed_build_falls_back_to_the_jit_and_is_not_retried(kernel_module, monkeypatch):
    tries = []

    def no_compiler(kernels, signatures, path):
        tries.append(path)
        raise OSError("no C compiler")

    monkeypatch.setattr(aot, "compile_kernels", no_compiler)
    for _ in range(2):
        kernels = aot.load("tinypkg.kernels", SIGNATURES, what="the test kernels")
        assert hasattr(kernels.total, "py_func")  # numba's dispatcher: the JIT runs it
    assert len(tries) == 1
    assert "no C compiler" in tries[0].with_name(tries[0].name.split(".")[0] + ".failed") \
        .read_text()


def test_a_kernel_module_may_import_only_constants_from_llmkit(kernel_module):
    kernel_module.write_text(KERNELS.replace("import WORDS", "import shingle_hashes"))
    with pytest.raises(TypeError, match="only constants"):
        aot.compiled_path("tinypkg.kernels", SIGNATURES)


def test_a_kernel_module_may_call_another_kernel_modules_functions_whose_source_names_it(kernel_module,
                                                                                      monkeypatch):
    kernel_module.write_text(KERNELS.replace("import WORDS", "import WORDS\nfrom llmkit.hf._kquant_kernels import fdiv")
                             .replace("return out", "return out + np.uint64(fdiv(np.float32(2), np.float32(1)))"))
    values = np.arange(1, 1000, dtype=np.uint64)
    compiled = aot.load("tinypkg.kernels", SIGNATURES, what="the test kernels")
    assert compiled.__file__.endswith(".so")
    assert compiled.total(values, np.uint64(7)) == aot.just_in_time("tinypkg.kernels").total(values, np.uint64(7))
    digest = aot._source_digest
    monkeypatch.setattr(aot, "_source_digest", lambda m: digest(m) + (b"edited" if m.endswith("_kquant_kernels") else b""))
    assert aot.compiled_path("tinypkg.kernels", SIGNATURES) != Path(compiled.__file__)


def _root():
    from pathlib import Path

    return Path(aot.__file__).resolve().parents[2]
