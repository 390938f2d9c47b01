"""numba kernels compiled ahead of time, so that the processes which run them never import numba.

Importing numba and loading kernels from its cache costs a process over half a second and
well over 100 MB of memory (LLVM, the compiled code, numba's type system). A kernel module —
a plain module of `@njit` functions — is instead compiled on first use with numba.pycc into
an extension module in its package's `__pycache__/`, named by a hash of the kernel source,
the signatures and the constants it imports from other llmkit modules, so an edit builds a
new one; every
later process imports that small module and nothing of numba. Where it cannot be built (no C
compiler, a numba without pycc, a read-only package folder) the kernels run through numba's
JIT with its cache, and a failed build is remembered so that not every process retries it.

A kernel module imports from other llmkit modules only constants (numbers, strings, numpy
arrays) and the `@njit` functions of other kernel modules, which are compiled into it (their
module's source, and what it imports, go into the hash): every other function its kernels call
lives in it. The compiled functions release the GIL
(as `nogil=True`): callers may run them in threads.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


def load(kernels: str, signatures: dict[str, str], *, what: str, warm_up=None):
    """The kernels of module `kernels` (dotted name): the functions named in `signatures`
    (name -> numba signature, e.g. "i8(u1[::1], i8)") compiled ahead of time where that can
    be had, else the module itself (numba's JIT). `what` names them in the one-time notice;
    see `just_in_time` for `warm_up`."""
    path = compiled_path(kernels, signatures)
    return (ahead_of_time(path, lambda p: compile_kernels(kernels, signatures, p), what)
            or just_in_time(kernels, warm_up))


def just_in_time(kernels: str, warm_up=None) -> ModuleType:
    """The kernel module itself: numba compiles (or loads from its cache) on each first call.
    `warm_up(module)`, if given, makes numba's first call of the process with scipy hidden
    (see numba_without_scipy)."""
    with numba_without_scipy():
        module = importlib.import_module(kernels)
        if warm_up is not None:
            warm_up(module)
    return module


def ahead_of_time(path: Path | None, compile, what: str) -> ModuleType | None:
    """The extension module at `path`, built by `compile(path)` if it is not there yet; None
    where it cannot be (no path, or this build failed before: see the `.failed` file)."""
    if path is None:
        return None
    failed = path.with_name(_module_name(path) + ".failed")
    if failed.exists():
        return None
    if not path.exists():
        print(f"llmkit: compiling {what}, once (about 20 s)", file=sys.stderr)
        try:
            compile(path)
        except Exception as e:  # no C compiler, or a numba without pycc: the JIT does the same
            failed.write_text(f"{type(e).__name__}: {e}\n")
            return None
    spec = importlib.util.spec_from_file_location(_module_name(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_path(kernels: str, signatures: dict[str, str]) -> Path | None:
    """Where the extension module of `kernels` compiled for `signatures` lives: named by a
    hash of both, of the kernel source and of what it imports. None where the folder is not
    writable."""
    import numpy as np

    source_file = Path(importlib.util.find_spec(kernels).origin)
    key = hashlib.sha256(_source_digest(kernels))
    key.update(repr(sorted(signatures.items())).encode())
    key.update(np.__version__.encode())
    folder = writable_cache_folder(source_file.parent)
    if folder is None:
        return None
    name = f"{kernels.rsplit('.', 1)[-1]}_{key.hexdigest()[:16]}"
    return folder / (name + importlib.machinery.EXTENSION_SUFFIXES[0])


def writable_cache_folder(package: Path) -> Path | None:
    """`package/__pycache__`, made if need be, where compiled kernels live; None if not writable."""
    folder = package / "__pycache__"
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK) else None


def compile_kernels(kernels: str, signatures: dict[str, str], path: Path) -> None:
    """Build the extension module of `kernels` at `path` with numba.pycc; older builds of the
    same kernel module are deleted."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba.pycc is pending deprecation
        import numba.pycc.compiler
        from numba.pycc import CC

    module = importlib.import_module(kernels)

    class ReleasingGil(numba.pycc.compiler.Flags):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True  # as nogil=True: callers may run kernels in threads

    name = _module_name(path)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        cc = CC(name)
        cc.output_dir = tmp
        for function, signature in signatures.items():
            cc.export(function, signature)(getattr(module, function).py_func)
        flags = numba.pycc.compiler.Flags
        numba.pycc.compiler.Flags = ReleasingGil
        try:
            with numba_without_scipy():
                cc.compile()
        finally:
            numba.pycc.compiler.Flags = flags
        os.replace(next(Path(tmp).glob(name + ".*")), path)
    stem = name.rsplit("_", 1)[0]
    for stale in path.parent.glob(stem + "_*"):
        if stale != path and _module_name(stale).rsplit("_", 1)[0] == stem:
            stale.unlink(missing_ok=True)


@contextmanager
def numba_without_scipy():
    """numba's first compiled call in a process imports scipy.linalg (a quarter to half a
    second) only to learn whether np.dot-like functions may call BLAS; without it they use
    a plain loop. Kernels that call no BLAS hide scipy.linalg during that call."""
    if "scipy.linalg" in sys.modules:
        yield
        return
    sys.modules["scipy.linalg"] = None  # makes `import scipy.linalg` raise ImportError
    try:
        yield
    finally:
        if sys.modules.get("scipy.linalg", 0) is None:
            del sys.modules["scipy.linalg"]


def _module_name(path: Path) -> str:
    return path.name.split(".")[0]


def _source_digest(kernels: str) -> bytes:
    """A hash of a kernel module's source and of the constants and kernel modules it imports."""
    source = Path(importlib.util.find_spec(kernels).origin).read_text(encoding="utf-8")
    key = hashlib.sha256(source.encode())
    for name, value in _imported_constants(source):
        key.update(name.encode())
        key.update(_constant_bytes(value))
    return key.digest()


def _imported_constants(source: str):
    """(name, value) of everything the kernel source imports from llmkit modules."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmkit"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                yield alias.name, getattr(module, alias.name)


def _constant_bytes(value) -> bytes:
    import numpy as np

    if isinstance(value, np.ndarray):
        return str(value.dtype).encode() + value.tobytes()
    if isinstance(value, (bool, int, float, str, bytes, np.generic)):
        return repr(value).encode()
    if hasattr(value, "py_func") and value.py_func.__module__.startswith("llmkit."):  # a kernel module's @njit
        return _source_digest(value.py_func.__module__)
    raise TypeError(f"a kernel module imports only constants and other kernel modules' @njit functions from "
                    f"llmkit modules, not {value!r}: move the function into the kernel module")
