"""The house has one function named ``compile``: ``crossrt.compile`` (``crossrt/choice/auto.py``),
which compiles for the device named or, with ``device="auto"``, chooses one. The compiler's
inner step is ``compile_for_device``. A driver's ``Driver.compile`` method is the driver
contract's, not a free function, and is not counted.

Every module under src/crossrt is parsed (never imported) for a module-level ``compile``: a
``def``, an assignment, or an import under that name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import crossrt
import crossrt.choice
import crossrt.choice.auto
import crossrt.compiler

SRC = Path(crossrt.__file__).resolve().parent
HOME = "choice/auto.py"
RE_EXPORTS = frozenset({"crossrt.choice", "crossrt.choice.auto"})


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_from(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``import from`` reads."""
    if not node.level:
        return node.module or ""
    package = _module(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def compile_bindings(path: Path, source: str) -> list[str]:
    """Every module-level binding of the name ``compile`` in ``source``, described."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "compile":
            found.append(f"def compile (line {node.lineno})")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "compile" for t in targets):
                found.append(f"compile = ... (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == "compile":
                    where = _imported_from(path, node)
                    if where not in RE_EXPORTS:
                        found.append(f"from {where} import {alias.name} (line {node.lineno})")
    return found


def test_one_function_named_compile_in_the_source() -> None:
    bindings = {
        str(path.relative_to(SRC)): found
        for path in sorted(SRC.rglob("*.py"))
        if (found := compile_bindings(path, path.read_text(encoding="utf-8")))
    }
    home = bindings.pop(HOME, [])
    assert not bindings, (
        "one module-level `compile` only, crossrt.compile in crossrt/choice/auto.py; name "
        f"other compile steps for what they are (compile_for_device): {bindings}"
    )
    assert len(home) == 1 and home[0].startswith("def compile"), home


def test_every_public_compile_is_crossrt_compile() -> None:
    assert crossrt.choice.compile is crossrt.compile
    assert crossrt.choice.auto.compile is crossrt.compile
    assert "compile" not in crossrt.compiler.__all__
    # crossrt.compiler.compile is the compiler's module of that name, not a function.
    assert not callable(getattr(crossrt.compiler, "compile", None))
    assert crossrt.compiler.compile_for_device.__name__ == "compile_for_device"


def test_the_checker_finds_each_kind_of_binding() -> None:
    path = SRC / "compiler" / "x.py"
    source = (
        "from .compile import build as compile\n"
        "compile = print\n"
        "def compile(): ...\n"
        "from ..choice import compile\n"
        "class Driver:\n    def compile(self): ...\n"
    )
    assert compile_bindings(path, source) == [
        "from crossrt.compiler.compile import build (line 1)",
        "compile = ... (line 2)",
        "def compile (line 3)",
    ]
