"""No runtime room reaches into another room's objects by their underscore members (issue 25.2).

A room is a module of ``src/crossrt/runtime``, except the folders ``memory/`` (the tensor and its
storage, shared memory, transfers: one room) and ``cores/``, each one room. Every module is
parsed (never imported). An access ``x._name`` (``x`` neither ``self``, ``cls`` nor
``super()``) is refused when ``_name`` is a member that another room defines and this room does
not: that room's objects are reached through the names it makes public (a method, a property,
or a function of its module, as ``memory/tensor.py``'s ``host_view_of``), so that it can change
its insides without its readers noticing. A name no runtime room defines (a library's) is no
room's.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "crossrt" / "runtime"
FOLDER_ROOMS = ("memory", "cores")

# (room, member): why it stays. Keep this short; each entry says why a public name will not do.
ALLOWED = {
    ("inputs.py", "_view"): "a Tensor input's host view, read per input on every run() "
    "(a slot read; a function call there would cost a tiny model's run ~1%)",
    ("inputs.py", "_described"): "read beside _view on the same hot path, for the same reason",
    ("binding.py", "_view"): "Binding.holds compares a bound Tensor's view on every bound run, "
    "the hottest path of a bound request",
}


def room_of(path: Path) -> str:
    """The room of a module: its path under runtime/, or its folder's name for a folder room."""
    rel = path.relative_to(RUNTIME)
    return rel.parts[0] + "/" if rel.parts[0] in FOLDER_ROOMS else rel.as_posix()


def defined_members(tree: ast.AST) -> set[str]:
    """Underscore names a module defines: functions, classes, attributes it assigns (on any
    object), names it assigns, and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ = ("_view", ...)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def foreign_accesses(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, member, expression)`` of each ``x._member`` whose ``x`` is not this object."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super":
            continue
        found.append((node.lineno, node.attr, ast.unparse(node)))
    return found


def crossings() -> list[str]:
    """Every access from one runtime room to another room's underscore member."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(RUNTIME.rglob("*.py"))}
    by_room: dict[str, set[str]] = {}
    for path, tree in trees.items():
        by_room.setdefault(room_of(path), set()).update(defined_members(tree))
    every = set().union(*by_room.values())
    out = []
    for path, tree in trees.items():
        room = room_of(path)
        for line, member, text in foreign_accesses(tree):
            if member in by_room[room] or member not in every:
                continue  # its own room's, or no runtime room's (a library's)
            if (room, member) in ALLOWED:
                continue
            out.append(f"runtime/{path.relative_to(RUNTIME)}:{line}: {text}")
    return out


def test_no_runtime_room_reaches_into_anothers_underscore_members() -> None:
    found = crossings()
    assert not found, (
        "a runtime room reaches into another room's underscore members; give that room a "
        "public name for what is needed (a method, a property, a function of its module):\n"
        + "\n".join(found)
    )


def test_the_scan_finds_a_crossing(tmp_path: Path) -> None:
    """The scan can fail: one room calling another room's private method is found."""
    one = ast.parse("class A:\n    def _secret(self):\n        return 1\n")
    two = ast.parse("def use(a):\n    return a._secret() + a._own\n_own = 0\n")
    assert "_secret" in defined_members(one)
    found = [m for _, m, _ in foreign_accesses(two) if m not in defined_members(two)]
    assert found == ["_secret"]


def test_every_allowed_crossing_is_still_there() -> None:
    """An allow-list entry whose access is gone is stale: remove it."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(RUNTIME.rglob("*.py"))}
    used = {
        (room_of(path), member)
        for path, tree in trees.items()
        for _, member, _ in foreign_accesses(tree)
    }
    stale = set(ALLOWED) - used
    assert not stale, f"allow-list entries no longer used: {sorted(stale)}"
