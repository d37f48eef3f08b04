"""No function in src/crossrt over 80 lines of code, none in runtime/ over 60 (issue 25).

Every module under src/crossrt is parsed (never imported), except the generated protobuf code in
``server/proto/``. A function's size is its lines of code: lines from its ``def`` to its last
line that hold a token other than a comment, the docstrings of the function and of the functions
and classes nested in it excluded. A nested function counts in its own right and inside its
enclosing one.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "crossrt"
LIMIT = 80
RUNTIME_LIMIT = 60
_NOT_CODE = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
)
_Function = ast.FunctionDef | ast.AsyncFunctionDef


def code_lines(source: str) -> set[int]:
    """Line numbers of ``source`` that hold a token other than a comment."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers taken by the docstrings of every function, class and module in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            continue
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            end = body[0].end_lineno or body[0].lineno
            lines.update(range(body[0].lineno, end + 1))
    return lines


def function_sizes(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines of code)`` of every function in ``source``."""
    tree = ast.parse(source)
    code = code_lines(source) - docstring_lines(tree)
    sizes: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _Function):
                name = f"{prefix}{child.name}"
                span = range(child.lineno, (child.end_lineno or child.lineno) + 1)
                sizes.append((name, child.lineno, sum(1 for line in span if line in code)))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return sizes


def oversized(src: Path = SRC) -> list[str]:
    """``path:line name: N lines of code (limit L)`` for every function over its limit."""
    found: list[str] = []
    for path in sorted(src.rglob("*.py")):
        if path.is_relative_to(src / "server" / "proto"):
            continue
        limit = RUNTIME_LIMIT if path.is_relative_to(src / "runtime") else LIMIT
        for name, line, size in function_sizes(path.read_text(encoding="utf-8")):
            if size > limit:
                rel = path.relative_to(src.parent)
                found.append(f"{rel}:{line} {name}: {size} lines of code (limit {limit})")
    return found


def test_no_function_over_its_limit() -> None:
    found = oversized()
    assert not found, "functions over their size limit (split them into named steps):\n" + (
        "\n".join(found)
    )


def test_counting_skips_blank_comment_and_docstring_lines() -> None:
    source = '''
def f(x):
    """Doc.

    More doc.
    """

    # a comment
    y = """not a
docstring"""
    def g():
        """Nested doc."""
        return 1
    return (x,
            y)
'''
    sizes = {name: size for name, _, size in function_sizes(source)}
    # f: def, y = """...""" (2 lines), def g, return 1, return (2 lines) -> 7; g: def + return.
    assert sizes == {"f": 7, "f.g": 2}


def test_a_long_function_is_named(tmp_path: Path) -> None:
    package = tmp_path / "crossrt"
    (package / "runtime").mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(RUNTIME_LIMIT))
    (package / "runtime" / "long.py").write_text(f"def long():\n{body}", encoding="utf-8")
    (package / "fine.py").write_text(f"def fine():\n{body}", encoding="utf-8")
    assert oversized(package) == [
        f"crossrt/runtime/long.py:1 long: {RUNTIME_LIMIT + 1} lines of code (limit {RUNTIME_LIMIT})"
    ]
