"""Imports run one way: errors/dtypes/config/host/cancel -> model -> drivers -> compiler ->
runtime -> choice -> collectives -> server -> tools -> compat (ARCHITECTURE.md §2).

Every module under src/crossrt is parsed (never imported); an import of a later layer, absolute
(``crossrt.x``), relative (``..x``) or through ``importlib.import_module("crossrt.x")``, fails
the test. ``crossrt/__init__.py`` and ``crossrt/__main__.py`` re-export and dispatch, so they
may import anything; a name imported from the package root counts as the module it is
re-exported from.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "crossrt"
ROOT = "crossrt"
LAYERS = (
    "base",
    "model",
    "drivers",
    "compiler",
    "runtime",
    "choice",
    "collectives",
    "server",
    "scaleout",
    "tools",
    "compat",
    "onnxruntime",
)
BASE_MODULES = frozenset({"errors", "dtypes", "config", "host", "cancel"})
# The runtime's public modules for layers built over it (docs/runtime-api.md): top-level
# modules of the runtime layer.
RUNTIME_FACES = frozenset({"memory", "profiling", "executables"})
EXEMPT = frozenset({"crossrt", "crossrt.__main__"})


def layer_of(module: str) -> int | None:
    """The layer index of a ``crossrt...`` module, or None when it belongs to none."""
    parts = module.split(".")
    if parts[0] != ROOT or len(parts) < 2:
        return None
    top = parts[1]
    if top in BASE_MODULES:
        return 0
    if top in RUNTIME_FACES:
        return LAYERS.index("runtime")
    return LAYERS.index(top) if top in LAYERS[1:] else None


def module_name(path: Path, src: Path = SRC) -> tuple[str, bool]:
    """``(dotted name, is_package)`` of a file under ``src``."""
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join([*package, *([target] if target else [])])


def imported_modules(module: str, source: str, is_package: bool = False) -> list[tuple[str, str]]:
    """Every ``crossrt`` import in ``source``: ``(resolved target, import as written)``.

    ``from crossrt import name`` (or ``from .. import name`` reaching the root) yields
    ``crossrt.name``, which :func:`root_exports` maps when ``name`` is a re-export.
    """
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    found.append((alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve_relative(module, is_package, node.level, node.module)
                written = f"from {'.' * node.level}{node.module or ''} import"
            else:
                base = node.module or ""
                written = f"from {base} import"
            if base != ROOT and not base.startswith(ROOT + "."):
                continue
            for alias in node.names:
                # The name may be a submodule (`from .. import dtypes`) or an attribute.
                found.append((f"{base}.{alias.name}", f"{written} {alias.name}"))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                value = arg.value if isinstance(arg, ast.Constant) else None
                if isinstance(value, str) and (value == ROOT or value.startswith(ROOT + ".")):
                    found.append((value, f"{called}({value!r})"))
    return found


def root_exports(init_source: str) -> dict[str, str]:
    """Names the package root re-exports -> the module each comes from."""
    exports: dict[str, str] = {}
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                where = f"{ROOT}.{node.module}" if node.module else f"{ROOT}.{alias.name}"
                exports[alias.asname or alias.name] = where
    return exports


def target_layer(target: str, exports: Mapping[str, str], known: set[str]) -> int | None:
    """Layer of an import target, seeing through the root's re-exports.

    ``import crossrt`` counts as the highest layer the root re-exports; a name the root
    defines itself (``__version__``) as the base layer.
    """
    if target == ROOT:
        layers = [layer_of(m) for m in exports.values()]
        return max((x for x in layers if x is not None), default=0)
    parts = target.split(".")
    if (
        len(parts) == 2
        and target not in known
        and parts[1] not in BASE_MODULES | RUNTIME_FACES | set(LAYERS)
    ):
        name = parts[1]
        return layer_of(exports[name]) if name in exports else 0
    return layer_of(target)


def backward_imports(
    module: str,
    source: str,
    is_package: bool = False,
    exports: Mapping[str, str] | None = None,
    known: set[str] | None = None,
) -> list[str]:
    """``"module -> import"`` for every import of a later layer than the module's own."""
    if module in EXEMPT:
        return []
    own = layer_of(module)
    if own is None:
        return [f"{module} -> (module belongs to no layer: add it to LAYERS or BASE_MODULES)"]
    bad = []
    for target, written in imported_modules(module, source, is_package):
        layer = target_layer(target, exports or {}, known or set())
        if layer is not None and layer > own:
            bad.append(f"{module} ({LAYERS[own]}) -> {written} ({LAYERS[layer]})")
    return bad


def _sources() -> list[tuple[str, bool, str]]:
    return [
        (*module_name(path), path.read_text(encoding="utf-8")) for path in sorted(SRC.rglob("*.py"))
    ]


# -- the real package ------------------------------------------------------------------------


def test_source_tree_is_found() -> None:
    names = {name for name, _, _ in _sources()}
    assert {"crossrt", "crossrt.errors", "crossrt.model.builder", "crossrt.runtime"} <= names


def test_no_backward_imports() -> None:
    sources = _sources()
    known = {name for name, _, _ in sources}
    exports = root_exports((SRC / "__init__.py").read_text(encoding="utf-8"))
    offending = [
        line
        for name, is_package, source in sources
        for line in backward_imports(name, source, is_package, exports, known)
    ]
    assert not offending, "imports against the layer order:\n" + "\n".join(offending)


def test_every_module_belongs_to_a_layer() -> None:
    stray = [name for name, _, _ in _sources() if name not in EXEMPT and layer_of(name) is None]
    assert not stray, f"modules outside every layer: {stray}"


# -- the checker itself ------------------------------------------------------------------------

EXPORTS = {"Runtime": "crossrt.runtime", "Model": "crossrt.model", "StatusCode": "crossrt.errors"}
KNOWN = {"crossrt", "crossrt.errors", "crossrt.dtypes", "crossrt.model", "crossrt.runtime"}


@pytest.mark.parametrize(
    ("module", "is_package", "source", "expected"),
    [
        (
            "crossrt.model.builder",
            False,
            "from ..runtime import Runtime\n",
            ["crossrt.model.builder (model) -> from ..runtime import Runtime (runtime)"],
        ),
        (
            "crossrt.drivers.base",
            False,
            "import crossrt.compiler.compile\n",
            ["crossrt.drivers.base (drivers) -> import crossrt.compiler.compile (compiler)"],
        ),
        (
            "crossrt.errors",
            False,
            "def f():\n    from .model import Model\n",
            ["crossrt.errors (base) -> from .model import Model (model)"],
        ),
        (
            "crossrt.model",
            True,
            "from ..drivers import base\n",
            ["crossrt.model (model) -> from ..drivers import base (drivers)"],
        ),
        (
            "crossrt.model",
            True,
            "from ..tools import cli\n",
            ["crossrt.model (model) -> from ..tools import cli (tools)"],
        ),
        (
            "crossrt.compiler.compile",
            False,
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from crossrt.runtime.loaded import LoadedModel\n",
            [
                "crossrt.compiler.compile (compiler) -> from crossrt.runtime.loaded import "
                "LoadedModel (runtime)"
            ],
        ),
        (
            "crossrt.model.model",
            False,
            "from crossrt import Runtime\n",
            ["crossrt.model.model (model) -> from crossrt import Runtime (runtime)"],
        ),
        (
            "crossrt.model.model",
            False,
            "from .. import Runtime\n",
            ["crossrt.model.model (model) -> from .. import Runtime (runtime)"],
        ),
        (
            "crossrt.drivers.registry",
            False,
            "import importlib\nimportlib.import_module('crossrt.server.daemon')\n",
            [
                "crossrt.drivers.registry (drivers) -> import_module('crossrt.server.daemon') "
                "(server)"
            ],
        ),
        (
            "crossrt.runtime.runtime",
            False,
            "from ..choice import compile\n",
            ["crossrt.runtime.runtime (runtime) -> from ..choice import compile (choice)"],
        ),
        (
            "crossrt.config",
            False,
            "import crossrt\n",
            ["crossrt.config (base) -> import crossrt (runtime)"],
        ),
    ],
    ids=[
        "relative-up",
        "absolute",
        "inside-function",
        "package-init",
        "to-tools",
        "type-checking",
        "root-reexport",
        "relative-root-reexport",
        "import-module",
        "runtime-to-choice",
        "whole-package",
    ],
)
def test_checker_catches_backward_imports(
    module: str, is_package: bool, source: str, expected: list[str]
) -> None:
    assert backward_imports(module, source, is_package, EXPORTS, KNOWN) == expected


@pytest.mark.parametrize(
    ("module", "is_package", "source"),
    [
        ("crossrt.model.builder", False, "from .. import dtypes\nfrom ..errors import X\n"),
        ("crossrt.model.builder", False, "from .model import Model\nfrom . import spec\n"),
        ("crossrt.runtime.loaded", False, "from ..compiler import Executable\n"),
        ("crossrt.tools.cli", False, "from crossrt import __version__\n"),
        ("crossrt.tools.run", False, "from crossrt import Runtime\nimport crossrt\n"),
        ("crossrt.drivers", True, "from .base import Driver\nfrom ..model import Model\n"),
        ("crossrt.errors", False, "import enum\nfrom typing import Any\nimport numpy\n"),
        ("crossrt.compat.neuron", False, "import crossrt.tools.cli\nfrom ..server import x\n"),
        ("crossrt", True, "from .tools import cli\nfrom .compat import neuron\n"),
        ("crossrt.__main__", False, "from crossrt.tools.cli import main\n"),
        (
            "crossrt.model.x",
            False,
            "import crossrtextra.runtime\nfrom crossrt_other import y\n"
            "import importlib\nimportlib.import_module('crossrt_tools.server')\n",
        ),
    ],
    ids=[
        "to-base",
        "same-layer",
        "to-earlier",
        "root-own-name",
        "tools-to-root",
        "package-init",
        "third-party",
        "compat-last",
        "root-exempt",
        "main-exempt",
        "similar-names",
    ],
)
def test_checker_accepts_forward_and_same_layer_imports(
    module: str, is_package: bool, source: str
) -> None:
    assert backward_imports(module, source, is_package, EXPORTS, KNOWN) == []


def test_checker_reports_modules_outside_every_layer() -> None:
    (line,) = backward_imports("crossrt.misc", "import os\n")
    assert line.startswith("crossrt.misc -> ") and "no layer" in line


def test_root_exports_are_read_from_the_init() -> None:
    exports = root_exports(
        "from . import dtypes\nfrom .runtime import Runtime as RT\nfrom .errors import (A, B)\n"
        "__version__ = '1'\n"
    )
    assert exports == {
        "dtypes": "crossrt.dtypes",
        "RT": "crossrt.runtime",
        "A": "crossrt.errors",
        "B": "crossrt.errors",
    }


# -- no import cycle; drivers reached only through their package -----------------------------


def import_graph(sources: list[tuple[str, bool, str]]) -> dict[str, set[str]]:
    """``module -> modules it imports`` among ``sources``: every import counts, also those inside
    functions and under ``if TYPE_CHECKING:`` (a cycle of types is still a knot to untie), and
    ``from pkg import name`` counts as ``pkg.name`` when that is a module, else as ``pkg``."""
    known = {name for name, _, _ in sources}

    def owner(target: str) -> str:
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        return target

    return {
        name: {owner(t) for t, _ in imported_modules(name, source, is_package)} - {name}
        for name, is_package, source in sources
    }


def import_cycles(
    graph: Mapping[str, set[str]], exempt: frozenset[str] = EXEMPT
) -> list[list[str]]:
    """The import cycles in ``graph`` (strongly connected sets of two or more modules), the
    re-exporting root left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in exempt or nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for node in sorted(graph):
        if node not in index and node not in exempt:
            visit(node)
    return cycles


def test_no_import_cycle() -> None:
    cycles = import_cycles(import_graph(_sources()))
    assert not cycles, "modules importing each other:\n" + "\n".join(map(" <-> ".join, cycles))


def test_drivers_are_reached_through_their_package() -> None:
    """Outside ``drivers/``, only ``crossrt.drivers`` (its ``base``, ``registry`` and
    ``boundary``) is imported: a driver's own modules are found through the registry, never
    named."""
    allowed = {
        "crossrt.drivers",
        "crossrt.drivers.base",
        "crossrt.drivers.registry",
        "crossrt.drivers.boundary",
    }
    graph = import_graph(_sources())
    offending = [
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not module.startswith("crossrt.drivers")
        for target in sorted(targets)
        if target.startswith("crossrt.drivers.") and target not in allowed
    ]
    assert not offending, "\n".join(offending)


def test_cycle_finder_finds_type_only_and_lazy_cycles() -> None:
    sources = [
        ("crossrt.runtime.a", False, "from .b import B\n"),
        ("crossrt.runtime.b", False, "def f():\n    from .c import C\n"),
        (
            "crossrt.runtime.c",
            False,
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n",
        ),
        ("crossrt.runtime.d", False, "from .a import A\n"),
    ]
    assert import_cycles(import_graph(sources)) == [
        ["crossrt.runtime.a", "crossrt.runtime.b", "crossrt.runtime.c"]
    ]
    assert import_cycles(import_graph(sources[:2] + sources[3:])) == []


def test_import_crossrt_needs_no_serve_extra() -> None:
    """``crossrt.connect`` is imported on first use: ``import crossrt`` loads no grpc."""
    code = (
        "import sys, crossrt\n"
        "loaded = [m for m in ('grpc', 'tritonclient', 'crossrt.server') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert 'connect' in crossrt.__all__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- compat over the public face ---------------------------------------------------------------

# What the seed layers (crossrt.compat) may import: the package root (the users' tier), the base
# modules, the public packages of the earlier layers (their ``__init__`` only, never a module
# inside) and the runtime's public modules for layers built over it (docs/runtime-api.md).
COMPAT_MAY_IMPORT = frozenset(
    {
        "crossrt",
        "crossrt.errors",
        "crossrt.dtypes",
        "crossrt.config",
        "crossrt.model",
        "crossrt.drivers",
        "crossrt.compiler",
        "crossrt.memory",
        "crossrt.profiling",
        "crossrt.executables",
        "crossrt.collectives",
    }
)


def private_imports(
    module: str,
    source: str,
    is_package: bool,
    known: set[str],
    exports: Mapping[str, set[str]] | None = None,
) -> list[str]:
    """``"module -> import"`` for every import in a ``crossrt.compat`` module of a crossrt
    module outside :data:`COMPAT_MAY_IMPORT` (compat's own modules aside).

    ``from pkg import name`` counts as ``pkg`` when ``exports[pkg]`` (what the package's
    ``__init__`` re-exports) holds ``name``, else as ``pkg.name`` when that is a module, else
    as ``pkg``; so ``from crossrt import Runtime`` is the root and ``from crossrt.compiler
    import compile`` the compiler's package (not its ``compile`` module), while ``from
    crossrt.runtime import memory`` and ``from ...runtime.memory.tensor import Tensor`` are
    runtime internals.
    """
    if module != "crossrt.compat" and not module.startswith("crossrt.compat."):
        return []
    bad = []
    for target, written in imported_modules(module, source, is_package):
        package, _, name = target.rpartition(".")
        owner = package if name in (exports or {}).get(package, ()) else target
        while owner not in known and "." in owner:
            owner = owner.rsplit(".", 1)[0]
        if owner == "crossrt.compat" or owner.startswith("crossrt.compat."):
            continue
        if owner not in COMPAT_MAY_IMPORT:
            bad.append(f"{module} -> {written} ({owner})")
    return bad


def test_compat_imports_only_public_modules() -> None:
    """The seed layers sit over the public face: no ``crossrt.runtime.*``,
    ``crossrt.compiler.*`` or other internal module (issue 25, point 3)."""
    sources = _sources()
    known = {name for name, _, _ in sources}
    exports = {
        name: set(root_exports(source)) for name, is_package, source in sources if is_package
    }
    offending = [
        line
        for name, is_package, source in sources
        for line in private_imports(name, source, is_package, known, exports)
    ]
    assert not offending, (
        "compat imports internals; import the name from crossrt.memory, crossrt.profiling, "
        "crossrt.executables or another public module (docs/runtime-api.md):\n"
        + "\n".join(offending)
    )


FACE_KNOWN = {
    "crossrt",
    "crossrt.errors",
    "crossrt.dtypes",
    "crossrt.model",
    "crossrt.model.builder",
    "crossrt.compiler",
    "crossrt.compiler.cache",
    "crossrt.runtime",
    "crossrt.runtime.memory",
    "crossrt.runtime.memory.tensor",
    "crossrt.memory",
    "crossrt.compat",
    "crossrt.compat.guard",
    "crossrt.compat.neuron",
    "crossrt.compat.neuron.tensors",
}


@pytest.mark.parametrize(
    ("module", "is_package", "source", "expected"),
    [
        (
            "crossrt.compat.neuron.tensors",
            False,
            "from ...runtime.memory.tensor import Tensor\n",
            [
                "crossrt.compat.neuron.tensors -> from ...runtime.memory.tensor import Tensor "
                "(crossrt.runtime.memory.tensor)"
            ],
        ),
        (
            "crossrt.compat.neuron.tensors",
            False,
            "from crossrt.runtime import Runtime\n",
            [
                "crossrt.compat.neuron.tensors -> from crossrt.runtime import Runtime "
                "(crossrt.runtime)"
            ],
        ),
        (
            "crossrt.compat.neuron.tensors",
            False,
            "def f():\n    from ...compiler.cache import CompileCache\n",
            [
                "crossrt.compat.neuron.tensors -> from ...compiler.cache import CompileCache "
                "(crossrt.compiler.cache)"
            ],
        ),
        (
            "crossrt.compat.neuron",
            True,
            "from ...model import builder\n",
            ["crossrt.compat.neuron -> from ...model import builder (crossrt.model.builder)"],
        ),
        (
            "crossrt.compat.neuron.tensors",
            False,
            "import crossrt.runtime.memory\n",
            [
                "crossrt.compat.neuron.tensors -> import crossrt.runtime.memory "
                "(crossrt.runtime.memory)"
            ],
        ),
    ],
    ids=["relative-deep", "runtime-package", "lazy-compiler-module", "submodule-name", "import"],
)
def test_private_import_checker_catches(
    module: str, is_package: bool, source: str, expected: list[str]
) -> None:
    assert private_imports(module, source, is_package, FACE_KNOWN) == expected


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("crossrt.compat.neuron.tensors", "from ...memory import Tensor\n"),
        ("crossrt.compat.neuron.tensors", "from crossrt import Runtime, __version__\n"),
        ("crossrt.compat.neuron.tensors", "from ... import dtypes\nfrom ...errors import X\n"),
        ("crossrt.compat.neuron.tensors", "from ...compiler import Executable\n"),
        ("crossrt.compat.neuron.tensors", "from ..guard import guarded\nfrom . import state\n"),
        ("crossrt.runtime.memory.tensor", "from ...compiler.cache import CompileCache\n"),
        ("crossrt.compat.neuron.tensors", "from ...compiler import compile\n"),
    ],
    ids=["face", "root", "base", "package-root", "compat-own", "not-compat", "re-export"],
)
def test_private_import_checker_accepts(module: str, source: str) -> None:
    exports = {"crossrt.compiler": {"Executable", "compile"}}
    assert (
        private_imports(module, source, False, FACE_KNOWN | {"crossrt.compiler.compile"}, exports)
        == []
    )
