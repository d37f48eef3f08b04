"""docs/ARCHITECTURE.md is a map that checks itself: what it names exists, and its tables are
the code's.

- Every path (``src/...``, ``tests/...``, ``docs/...``, ``benchmarks/...``, or one under
  ``src/crossrt/`` such as ``runtime/loaded.py``), every file name and every module
  (``crossrt.x.y``, or a name one defines: ``crossrt.compile``) written in backticks exists.
- Every module under ``src/crossrt`` is named in the package layout (§3): a module added,
  moved or removed changes the map with it.
- The drivers table equals the ``crossrt.drivers`` entry points in pyproject.toml (names and
  objects), and the layers list equals ``tests/unit/test_layering.py``'s ``LAYERS`` (and its
  base modules).

Everything is read from the files (nothing is imported), so the test runs without any engine;
every mismatch is reported at once, each with what to fix. tests/README.md is held to the
same rule for the names it writes.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "crossrt"
MAP = REPO / "docs" / "ARCHITECTURE.md"
LAYERING = REPO / "tests" / "unit" / "test_layering.py"

# A file name the map may write without its folder: these extensions are the project's own
# files; others (``model.crm``, ``<key>.json``) name what a user or the runtime writes.
CHECKED_SUFFIXES = (".py", ".md", ".toml", ".proto", ".sh", ".txt", ".cfg")
# Folders a relative path may start from, tried in order.
BASES = (REPO, SRC, REPO / "src", REPO / "docs", REPO / "tests")
SKIPPED_DIRS = frozenset({"build", "dist", "__pycache__", "node_modules"})
SPAN = re.compile(r"`([^`\n]+)`")
MODULE = re.compile(r"crossrt(?:\.[A-Za-z_]\w*)+")
BLOCK_PATH = re.compile(r"(?<![\w/.])(?:src|tests|docs|benchmarks|examples)/[\w./-]*\w/?")
PATHLIKE = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")


def _fenced(text: str) -> Iterator[tuple[bool, str]]:
    """Each line of ``text`` with whether it lies inside a fenced code block."""
    inside = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        yield inside, line


def spans(text: str) -> list[str]:
    """The backticked spans of ``text`` outside fenced code blocks, and inside them (what a
    user types or sees) the paths under the project's own top folders."""
    found: list[str] = []
    for inside, line in _fenced(text):
        found.extend(BLOCK_PATH.findall(line) if inside else SPAN.findall(line))
    return found


@cache
def basenames() -> frozenset[str]:
    """The names of the project's files and folders, wherever they lie (hidden folders, the
    virtual environment and build outputs not walked)."""
    names: set[str] = set()
    for _, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
        names.update(dirs)
        names.update(files)
    return frozenset(names)


@cache
def top_level_names(path: Path) -> frozenset[str]:
    """Names a module defines or imports at its top level (what ``crossrt.x.name`` may be)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            is_all = any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
            if is_all and isinstance(node.value, ast.List | ast.Tuple):
                # Names served by a module __getattr__ (crossrt.connect) are in __all__.
                names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    return frozenset(names)


def module_file(dotted: str) -> Path | None:
    """The file of module ``crossrt.x.y``, or None."""
    base = SRC.parent.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_problem(dotted: str) -> str | None:
    """Why ``crossrt.x.y`` (a module, or a name a module defines, with ``:`` allowed before
    the name as an entry point writes it) names nothing, or None."""
    module, _, attr = dotted.partition(":")
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]))
        if path is None:
            continue
        rest = [*parts[cut:], *([attr] if attr else [])]
        if not rest or rest[0] in top_level_names(path):
            return None  # a deeper name (crossrt.Runtime.load) is the class's to hold
        return f"{'.'.join(parts[:cut])} ({path.relative_to(REPO)}) defines no {rest[0]!r}"
    return "no such module under src/crossrt"


def path_problem(span: str) -> str | None:
    """Why a path or file name names no file or folder of the project, or None."""
    if "/" not in span:
        return None if span in basenames() else "no file of that name in the project"
    folder = span.endswith("/")
    for base in BASES:
        found = base / span.rstrip("/")
        if found.is_dir() if folder else found.exists():
            return None
    return f"not found under {', '.join(str(b.relative_to(REPO) or '.') for b in BASES)}"


def name_problems(text: str, doc: str) -> list[str]:
    """Every backticked path, file name and module of ``text`` that does not exist."""
    problems: list[str] = []
    for span in dict.fromkeys(spans(text)):
        word = span.removesuffix("()")
        why: str | None = None
        if MODULE.fullmatch(word.split(":")[0]) and word.count(":") <= 1:
            # A file may look like a module (packaging/crossrt.service).
            why = None if word in basenames() else module_problem(word)
        elif (
            PATHLIKE.fullmatch(word)
            and not word.startswith(".")
            and ("/" in word or word.endswith(CHECKED_SUFFIXES))
        ):
            why = path_problem(word)
        if why:
            problems.append(f"{doc}: `{span}`: {why}; correct or remove it")
    return problems


def table_with(text: str, first: str) -> list[list[str]]:
    """The data rows of the first markdown table whose header's first cell is ``first``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and line.strip("| ").split("|")[0].strip() == first:
            return table_rows("\n".join(lines[i:]))
    return []


def section(text: str, title: str) -> str:
    """The body of the ``## ...`` section whose heading contains ``title``."""
    found = re.search(rf"^## [^\n]*{re.escape(title)}[^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return found.group(1) if found else ""


def table_rows(body: str) -> list[list[str]]:
    """The data rows of the first markdown table in ``body``, as cells."""
    rows: list[list[str]] = []
    for line in body.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # the header row


def entry_points() -> dict[str, str]:
    """pyproject.toml's ``crossrt.drivers`` entry points: name -> ``module:object``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return dict(project["entry-points"]["crossrt.drivers"])


def driver_problems(text: str) -> list[str]:
    """The drivers table (``| driver | entry point | ...``, a row ``| `name` | `module:Object`
    | ...``) against the entry points."""
    rows = table_with(text, "driver")
    if not rows:
        return ["no drivers table (first header cell 'driver'): add one, a row per entry point"]
    table = {r[0].strip("`"): (r[1].strip("`") if len(r) > 1 else "") for r in rows}
    wanted = entry_points()
    problems = [
        f"drivers table: `{name}` is an entry point (`{target}`) but has no row; add one"
        for name, target in wanted.items()
        if name not in table
    ]
    for name, target in table.items():
        if name not in wanted:
            problems.append(f"drivers table: `{name}` is no crossrt.drivers entry point; drop it")
        elif target != wanted[name]:
            problems.append(
                f"drivers table: `{name}`'s entry point is `{wanted[name]}` in pyproject.toml, "
                f"the table says `{target}`"
            )
    return problems


def layering() -> tuple[tuple[str, ...], frozenset[str]]:
    """``LAYERS`` and ``BASE_MODULES`` of tests/unit/test_layering.py, read without importing."""
    values: dict[str, object] = {}
    for node in ast.parse(LAYERING.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "LAYERS":
                values[name] = ast.literal_eval(node.value)
            elif name == "BASE_MODULES":  # frozenset({...})
                assert isinstance(node.value, ast.Call)
                values[name] = ast.literal_eval(node.value.args[0])
    return tuple(values["LAYERS"]), frozenset(values["BASE_MODULES"])  # type: ignore[arg-type]


def layer_problems(text: str) -> list[str]:
    """The layers (§ "Layers": a fenced block, one layer a line, its name first) against
    test_layering.py."""
    body = section(text, "Layers")
    lines = [line for inside, line in _fenced(body) if inside and line.strip()]
    named = [line.replace("->", " ").split()[0] for line in lines]
    layers, base = layering()
    problems: list[str] = []
    if named != list(layers):
        problems.append(
            f"layers: the map lists {named}, tests/unit/test_layering.py's LAYERS is "
            f"{list(layers)}; write the map's block in LAYERS' order"
        )
    base_line = next((line for line, n in zip(lines, named, strict=True) if n == "base"), "")
    missing = sorted(m for m in base if not re.search(rf"\b{m}\b", base_line))
    if missing:
        problems.append(f"layers: the base line lacks BASE_MODULES {missing}; add them")
    return problems


@cache
def own_names() -> frozenset[str]:
    """The names crossrt's own modules define at their top level (not the seed APIs'
    of compat/ and onnxruntime/, which reuse names such as ``Device``), and ``__all__``."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).parts[0] in ("compat", "onnxruntime", "proto"):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                names.add(node.targets[0].id)
                if node.targets[0].id == "__all__" and isinstance(node.value, ast.List):
                    names.update(ast.literal_eval(node.value))
    return frozenset(names)


def concept_problems(text: str) -> list[str]:
    """The concepts table (``| name | ...``): each backticked name in its first column is one
    of crossrt's own (a class or function it defines, wherever it lives)."""
    problems: list[str] = []
    for row in table_with(text, "name"):
        for span in SPAN.findall(row[0]):
            name = span.split("(")[0].split(".")[-1]
            if name.isidentifier() and name not in own_names():
                problems.append(
                    f"concepts table: `{span}`: crossrt defines no {name!r}; name what it is"
                )
    return problems


def layout_problems(text: str) -> list[str]:
    """Every module under src/crossrt named in the package layout (§ "Package layout") by its
    path under src/crossrt (``runtime/loaded.py``); generated code and packages' faces
    (``__init__.py``) excepted."""
    named = set(spans(section(text, "Package layout")))
    problems: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if path.name == "__init__.py" or "/proto/" in f"/{rel}":
            continue
        if rel not in named:
            problems.append(f"package layout: `{rel}` (src/crossrt/{rel}) is not named; add a row")
    return problems


def test_the_architecture_map_names_only_what_exists() -> None:
    text = MAP.read_text(encoding="utf-8")
    problems = [
        *name_problems(text, "docs/ARCHITECTURE.md"),
        *driver_problems(text),
        *layer_problems(text),
        *concept_problems(text),
        *layout_problems(text),
    ]
    assert not problems, f"docs/ARCHITECTURE.md disagrees with the code ({len(problems)}):\n" + (
        "\n".join(problems)
    )


def readme_problems(text: str) -> list[str]:
    """tests/README.md's folders table against the folders of tests/ that hold tests, and the
    folders it says ``make test-fast`` runs against the Makefile's target."""
    problems = name_problems(text, "tests/README.md")
    listed = {row[0].strip("`/ ") for row in table_with(text, "folder")}
    folders = {p.parent.name for p in (REPO / "tests").glob("*/test_*.py")}
    problems += [
        f"tests/README.md: no row for `{f}/` in the folders table" for f in folders - listed
    ]
    problems += [f"tests/README.md: `{f}/` has a row but no tests" for f in listed - folders]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", makefile, re.M)
    make_fast = set(re.findall(r"tests/(\w+)", recipe.group(1))) if recipe else set()
    bullet = re.search(r"^- `make test-fast`(.*?)(?=^- |\n\n)", text, re.M | re.S)
    said_fast = set(re.findall(r"`tests/(\w+)`", bullet.group(1))) if bullet else set()
    if said_fast != make_fast:
        problems.append(
            f"tests/README.md: its `make test-fast` bullet names {sorted(said_fast)}, the "
            f"Makefile's test-fast runs {sorted(make_fast)}; make them agree"
        )
    return problems


def test_the_tests_readme_names_only_what_exists() -> None:
    problems = readme_problems((REPO / "tests" / "README.md").read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_the_checker_catches_a_lie() -> None:
    """Each check can fail: a made-up module, path, driver, layer, concept and folder, and a
    module left out of the layout, are all reported."""
    lie = (
        "## 1. Drivers\n\n| driver | entry point |\n| --- | --- |\n"
        "| `torch` | `crossrt.drivers.torch:TorchDriver` |\n\n"
        "## 2. Layers\n\n```\nbase (errors)\nmodel\n```\n\n"
        "## 3. Package layout\n\n| name | what it is |\n| --- | --- |\n| `Device` | a device |\n\n"
        "See `crossrt.runtime.devices`, `crossrt.NoSuchName`, `tests/models.py` and `nothere.py`.\n"
    )
    found = "\n".join(
        [
            *name_problems(lie, "lie"),
            *driver_problems(lie),
            *layer_problems(lie),
            *concept_problems(lie),
            *layout_problems(lie),
        ]
    )
    found += "\n" + "\n".join(
        readme_problems("| folder | needs |\n| --- | --- |\n| `nowhere/` | x |\n")
    )
    for expected in (
        "no row for `unit/`",
        "`nowhere/` has a row but no tests",
        "the Makefile's test-fast runs",
        "`crossrt.runtime.devices`",
        "`crossrt.NoSuchName`",
        "`tests/models.py`",
        "`nothere.py`",
        "`torch` is no crossrt.drivers entry point",
        "`onnxruntime` is an entry point",
        "the map lists ['base', 'model']",
        "lacks BASE_MODULES",
        "crossrt defines no 'Device'",
        "`errors.py` (src/crossrt/errors.py) is not named",
    ):
        assert expected in found, f"{expected!r} not reported in:\n{found}"
