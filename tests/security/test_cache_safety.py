"""The compile cache against an odd or hostile directory: one it cannot use, leftovers of
writers killed with SIGKILL, symbolic links planted where it creates files, and source records
edited to name another model."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt.compiler import cache_store
from crossrt.compiler.cache import CompileCache, shared_cache
from crossrt.model import GraphBuilder

X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def _model(seed: int) -> crossrt.Model:
    """``y = x * W + b`` with weights chosen by ``seed``."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"affine{seed}")
    x = b.input("x", "float32", [2, 3])
    w = rng.standard_normal(3).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    y = b.op("Add", [b.op("Mul", [x, b.constant(w, "W")]), b.constant(bias, "b")], outputs=["y"])
    b.output(y)
    return b.finish()


def _expected(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(3).astype(np.float32)
    return X * w + rng.standard_normal(3).astype(np.float32)


def _run(exe: crossrt.Executable) -> np.ndarray:
    with crossrt.Runtime() as rt:
        out: np.ndarray = rt.load(exe).run({"x": X})["y"]
        return out


def _save(tmp_path: Path, seed: int) -> Path:
    path = tmp_path / f"model{seed}.onnx"
    _model(seed).save(path)
    return path


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "crossrt" and r.levelno >= logging.WARNING
    ]


def _temps(directory: Path) -> list[Path]:
    return sorted(directory.glob(".tmp-*"))


# -- a cache that cannot be used --------------------------------------------------------------


def _path_is_a_file(cache_dir: Path, model_file: Path) -> None:
    cache_dir.write_text("not a directory")


def _locks_is_a_file(cache_dir: Path, model_file: Path) -> None:
    cache_dir.mkdir()
    (cache_dir / "locks").write_text("not a directory")


def _lock_is_a_directory(cache_dir: Path, model_file: Path) -> None:
    cache_dir.mkdir()
    (cache_dir / ".lock").mkdir()


def _entry_is_a_directory(cache_dir: Path, model_file: Path) -> None:
    crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    for crm in cache_dir.glob("*.crm"):
        crm.unlink()
        crm.mkdir()
        (crm / "inside").write_text("keeps the directory from being removed")


def _read_only(cache_dir: Path, model_file: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    crossrt.compile(_model(5), "cpu", cache_dir=cache_dir)  # a hit must still be served
    cache_dir.chmod(0o500)


@pytest.fixture
def restore_mode(tmp_path: Path) -> Iterator[None]:
    yield
    for path in [tmp_path, *tmp_path.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o700)


@pytest.mark.parametrize(
    "damage",
    [_path_is_a_file, _locks_is_a_file, _lock_is_a_directory, _entry_is_a_directory, _read_only],
    ids=lambda f: f.__name__.strip("_"),
)
def test_an_unusable_cache_warns_once_and_compiles_without_it(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    restore_mode: None,
    damage: Callable[[Path, Path], None],
) -> None:
    cache_dir = tmp_path / "cache"
    model_file = _save(tmp_path, 0)
    damage(cache_dir, model_file)
    with caplog.at_level(logging.WARNING, logger="crossrt"):
        for _ in range(3):  # a file, bytes, a Model: no raw OSError, one warning in all
            exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
            np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
            exe = crossrt.compile(model_file.read_bytes(), "cpu", cache_dir=cache_dir)
            np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
            exe = crossrt.compile(_model(0), "cpu", cache_dir=cache_dir)
            np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert str(cache_dir) in warned[0] and "without" in warned[0], warned
    if damage is _read_only:  # what the cache holds is still served
        crossrt.compile(_model(5), "cpu", cache_dir=cache_dir)
        cache = shared_cache(cache_dir)
        assert cache is not None and cache.stats.hits == 1


def test_what_is_asked_of_an_unusable_cache_itself_is_a_crossrt_error(tmp_path: Path) -> None:
    data = crossrt.compile(_model(0), "cpu").to_bytes()
    cache = CompileCache(tmp_path / "cache")
    (cache.directory / ".lock").mkdir()
    calls: list[Callable[[], object]] = [
        lambda: cache.import_entry(data),
        lambda: cache.remove("0" * 64),
        lambda: cache.prune(0),
    ]
    for call in calls:
        with pytest.raises(crossrt.InvalidArgumentError, match="in compile cache") as info:
            call()
        assert str(cache.directory) in info.value.message
    # A bad cache version is the caller's error, cache or no cache.
    with pytest.raises(crossrt.InvalidArgumentError, match="cache version"):
        crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "file", cache_version=-1)


# -- writers killed with SIGKILL --------------------------------------------------------------

_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    import crossrt
    from crossrt.compiler import cache_store

    model, cache_dir, mode = sys.argv[1:4]
    if mode == "named":
        cache_store.LINKS = ()  # as on a file system without unnamed files (O_TMPFILE)
    real_write = cache_store._write

    def write(fd, data):
        if bytes(data[:8]) == b"CROSSRTM":  # the entry: half of it written, then killed
            real_write(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        real_write(fd, data)

    cache_store._write = write
    crossrt.compile(model, "cpu", cache_dir=cache_dir)
    """
)


@pytest.mark.parametrize("mode", ["unnamed", "named"])
def test_a_killed_writers_temporaries_go_at_the_next_start_and_count_in_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    if mode == "unnamed" and cache_store.probe_links(cache_dir) is None:
        pytest.skip("this file system cannot name an unnamed file (O_TMPFILE)")
    model_file = _save(tmp_path, 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSRT_CACHE")}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(model_file), str(cache_dir), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    _, err = child.communicate(timeout=300)
    assert child.returncode == -signal.SIGKILL, err
    assert [p for p in cache_dir.glob("*.crm") if not p.name.startswith(".")] == []
    if mode == "unnamed":
        assert _temps(cache_dir) == []  # nothing had a name yet
    else:
        (left,) = _temps(cache_dir)  # the entry's, named by the process that died
        assert left.name.startswith(f".tmp-{child.pid}-"), left.name

    # A live process's temporary is another writer at work: kept, and counted.
    size = len(crossrt.compile(model_file, "cpu").to_bytes())
    live = cache_dir / cache_store.temp_name(".crm")
    live.write_bytes(bytes(size))
    assert live.name.startswith(f".tmp-{os.getpid()}-")
    CompileCache(cache_dir)  # the next start
    assert _temps(cache_dir) == [live]

    budget = size + size // 2  # room for the entry or the temporary, not for both
    monkeypatch.setenv("CROSSRT_CACHE_MAX_SIZE", str(budget))
    exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
    cache = shared_cache(cache_dir)
    assert cache is not None and cache.max_bytes == budget
    held = sum(e.size for e in cache.entries()) + sum(p.stat().st_size for p in _temps(cache_dir))
    assert held <= budget
    assert cache.stats.evictions == 1
    assert _temps(cache_dir) == [live]  # never evicted: its writer is alive


# -- symbolic links planted where the cache creates files -------------------------------------


def _names_created(tmp_path: Path, model_file: Path) -> list[str]:
    """The files a compile of ``model_file`` creates in a cache (the same in every one)."""
    scratch = tmp_path / "scratch"
    crossrt.compile(model_file, "cpu", cache_dir=scratch)
    crossrt.compile(model_file, "cpu", cache_dir=scratch)  # a hit writes its records too
    names = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*") if p.is_file())
    assert any(n.endswith(".crm") for n in names) and "CACHEDIR.TAG" in names
    assert any(n.startswith("locks/") for n in names)
    assert any(n.startswith("sources/paths/") for n in names)
    return names


def _outside(outside: Path) -> dict[str, bytes]:
    return {str(p.relative_to(outside)): p.read_bytes() for p in outside.rglob("*") if p.is_file()}


@pytest.mark.parametrize("target", ["missing", "existing"])
def test_links_planted_in_the_cache_are_not_written_through(
    tmp_path: Path, target: str, caplog: pytest.LogCaptureFixture
) -> None:
    model_file = _save(tmp_path, 0)
    names = _names_created(tmp_path, model_file)
    outside = tmp_path / "outside"
    outside.mkdir()
    cache_dir = tmp_path / "cache"
    for sub in ("locks", "sources/paths"):
        (cache_dir / sub).mkdir(parents=True)
    for i, name in enumerate(names):
        victim = outside / f"victim{i}"
        if target == "existing":
            victim.write_bytes(b"precious")
        (cache_dir / name).symlink_to(victim)
    before = _outside(outside)
    with caplog.at_level(logging.WARNING, logger="crossrt"):
        for _ in range(2):
            exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
            np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
    assert _outside(outside) == before


@pytest.mark.parametrize("planted", ["locks", "sources", "sources/paths"])
def test_a_linked_cache_subdirectory_is_not_written_into(tmp_path: Path, planted: str) -> None:
    model_file = _save(tmp_path, 0)
    outside = tmp_path / "outside"
    outside.mkdir()
    cache_dir = tmp_path / "cache"
    (cache_dir / planted).parent.mkdir(parents=True, exist_ok=True)
    (cache_dir / planted).symlink_to(outside, target_is_directory=True)
    for _ in range(2):
        exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
        np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
    assert list(outside.iterdir()) == []


def test_a_linked_cache_directory_given_by_the_user_is_used(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "cache").symlink_to(real, target_is_directory=True)
    crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "cache")
    crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "cache")
    cache = shared_cache(tmp_path / "cache")
    assert cache is not None and cache.stats.hits == 1
    assert len(list(real.glob("*.crm"))) == 1


# -- source records edited to name another model ---------------------------------------------


def _record(cache_dir: Path, path: Path) -> Path:
    return cache_dir / "sources" / f"{hashlib.sha256(path.read_bytes()).hexdigest()}.json"


def _path_record(cache_dir: Path, path: Path) -> Path:
    name = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()
    return cache_dir / "sources" / "paths" / f"{name}.json"


def _point_at(record: Path, content_hash: str) -> None:
    value = json.loads(record.read_text())
    value["content_hash"] = content_hash
    record.write_text(json.dumps(value))


@pytest.mark.parametrize("edited", ["bytes record", "path record", "both"])
def test_an_edited_source_record_never_returns_another_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edited: str
) -> None:
    monkeypatch.setattr(cache_store, "RACY_NS", 0)  # files are known by their status at once
    cache_dir = tmp_path / "cache"
    a, b = _save(tmp_path, 0), _save(tmp_path, 1)
    hash_a, hash_b = _model(0).content_hash, _model(1).content_hash
    for path in (a, b, a, b):  # twice: the second compile records each file's status
        crossrt.compile(path, "cpu", cache_dir=cache_dir)
    assert json.loads(_path_record(cache_dir, a).read_text())["content_hash"] == hash_a
    if edited != "path record":
        _point_at(_record(cache_dir, a), hash_b)
    if edited != "bytes record":
        _point_at(_path_record(cache_dir, a), hash_b)  # A's status, B's content
    else:
        _path_record(cache_dir, a).unlink()  # so that A's bytes are looked up
    for source in (a, a.read_bytes(), a):
        exe = crossrt.compile(source, "cpu", cache_dir=cache_dir)
        assert exe.content_hash == hash_a
        np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
    # The records are right again, and B is untouched.
    assert json.loads(_record(cache_dir, a).read_text())["content_hash"] == hash_a
    assert crossrt.compile(b, "cpu", cache_dir=cache_dir).content_hash == hash_b
    assert len(list(cache_dir.glob("*.crm"))) == 2
