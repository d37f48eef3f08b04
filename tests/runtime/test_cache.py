"""The compiled-model cache: keys, hits and misses, NNRt version rules, corruption, LRU
eviction, export/import, and real processes sharing one cache directory."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

import crossrt
from crossrt import InvalidArgumentError, StatusCode
from crossrt.compiler import cache as cache_module
from crossrt.compiler import cache_keys, cache_store
from crossrt.compiler.cache import CompileCache, cache_stats, shared_cache
from crossrt.config import parse_size, settings
from crossrt.drivers.registry import resolve_device
from crossrt.errors import InvalidContainerError
from crossrt.model import GraphBuilder

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


def _weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)


def _model(seed: int = 0, name: str = "mlp") -> crossrt.Model:
    """``y = relu(x @ W + b)``, x: float32 [2,4]; the weights depend on ``seed``."""
    w, bias = _weights(seed)
    b = GraphBuilder(name)
    x = b.input("x", "float32", [2, 4])
    y = b.op("Add", [b.op("MatMul", [x, b.constant(w, "W")]), b.constant(bias, "b")])
    b.output(b.op("Relu", [y], outputs=["y"]))
    return b.finish()


def _expected(seed: int) -> np.ndarray:
    w, bias = _weights(seed)
    return np.maximum(X @ w + bias, 0)


def _run(exe: crossrt.Executable) -> np.ndarray:
    with crossrt.Runtime() as rt:
        out: np.ndarray = rt.load(exe).run({"x": X})["y"]
        return out


def _cache(directory: Path, version: int = 0) -> CompileCache:
    cache = shared_cache(directory, version)
    assert cache is not None
    return cache


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    _model(0).save(path)
    return path


def _crm_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.crm"))


def test_miss_then_hit_counts_and_runs(tmp_path: Path, model_file: Path) -> None:
    cache_dir = tmp_path / "cache"
    before = cache_stats()
    first = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    second = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    stats = _cache(cache_dir).stats
    assert (stats.hits, stats.misses, stats.rebuilds, stats.evictions) == (1, 1, 0, 0)
    assert stats.compile_seconds > 0
    after = cache_stats()
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 1)
    assert len(_crm_files(cache_dir)) == 1
    assert second.content_hash == first.content_hash
    assert second.describe() == first.describe()
    np.testing.assert_allclose(_run(second), _expected(0), rtol=1e-6)
    # The same model given as a Model, as bytes or as an onnx proto finds the same entry.
    crossrt.compile(_model(0), "cpu", cache_dir=cache_dir)
    crossrt.compile(model_file.read_bytes(), "cpu", cache_dir=cache_dir)
    crossrt.compile(_model(0).proto, "cpu", cache_dir=cache_dir)
    assert _cache(cache_dir).stats.hits == 4
    assert len(_crm_files(cache_dir)) == 1


def test_hit_on_a_known_file_neither_parses_nor_validates(
    tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_dir = tmp_path / "cache"
    crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    other = _model(1).to_bytes()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cache hit must not load or validate the model")

    monkeypatch.setattr("crossrt.model.model._validate", refuse)
    monkeypatch.setattr("crossrt.model.model._parse", refuse)
    exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
    # A changed file is a different model: it is parsed (and here refused) again.
    model_file.write_bytes(other)
    with pytest.raises(AssertionError, match="must not load"):
        crossrt.compile(model_file, "cpu", cache_dir=cache_dir)


def test_an_unchanged_file_is_recognised_by_its_status_alone(
    tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file is trusted by its status only once it is older than the racy window; a test
    # cannot wait for that, so the window is closed.
    monkeypatch.setattr(cache_store, "RACY_NS", 0)
    reads: list[Path] = []
    real_read = cache_keys._read_file
    monkeypatch.setattr(cache_keys, "_read_file", lambda p: reads.append(p) or real_read(p))
    cache_dir = tmp_path / "cache"
    crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    assert len(reads) == 1
    exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    assert len(reads) == 1  # a hit without reading the model file at all
    np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)

    other = _model(1).to_bytes()
    assert len(other) == model_file.stat().st_size  # same size: only the times tell
    model_file.write_bytes(other)
    exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    assert len(reads) == 2
    np.testing.assert_allclose(_run(exe), _expected(1), rtol=1e-6)
    assert _cache(cache_dir).stats.misses == 2


def test_different_weights_are_different_entries(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    a = crossrt.compile(_model(0), "cpu", cache_dir=cache_dir)
    b = crossrt.compile(_model(1), "cpu", cache_dir=cache_dir)
    assert a.content_hash != b.content_hash
    assert len(_crm_files(cache_dir)) == 2
    again_a = crossrt.compile(_model(0), "cpu", cache_dir=cache_dir)
    again_b = crossrt.compile(_model(1), "cpu", cache_dir=cache_dir)
    assert _cache(cache_dir).stats.hits == 2
    np.testing.assert_allclose(_run(again_a), _expected(0), rtol=1e-6)
    np.testing.assert_allclose(_run(again_b), _expected(1), rtol=1e-6)


def test_options_driver_and_version_are_in_the_key(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache")
    content = _model(0).content_hash
    drv, dev = resolve_device("cpu", "onnxruntime")
    ref_drv, ref_dev = resolve_device("cpu", "reference")
    base = cache.key(content, drv, dev, crossrt.drivers.CompileOptions())
    keys = {
        base,
        cache.key(
            content, drv, dev, crossrt.drivers.CompileOptions(crossrt.drivers.PerformanceMode.LOW)
        ),
        cache.key(content, drv, dev, crossrt.drivers.CompileOptions(), fallback="cpu"),
        cache.key(content, ref_drv, ref_dev, crossrt.drivers.CompileOptions()),
        cache.key(_model(1).content_hash, drv, dev, crossrt.drivers.CompileOptions()),
        CompileCache(tmp_path / "cache", version=1).key(
            content, drv, dev, crossrt.drivers.CompileOptions()
        ),
    }
    assert len(keys) == 6
    assert cache.key(content, drv, dev, crossrt.drivers.CompileOptions()) == base  # deterministic
    # Compiling with other options stores another entry.
    crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "c2")
    crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "c2", performance_mode="LOW")
    crossrt.compile(_model(0), "cpu", driver="reference", cache_dir=tmp_path / "c2")
    assert len(_crm_files(tmp_path / "c2")) == 3
    assert _cache(tmp_path / "c2").stats.misses == 3


def test_an_executable_placed_with_fallback_is_cached(tmp_path: Path) -> None:
    b = GraphBuilder("mixed")  # ORT has no int16 Max: that node falls back to the reference
    x = b.input("x", "float32", [2, 4])
    as_int = b.op("Cast", [b.op("Relu", [x])], to=TensorProto.INT16)
    back = b.op("Cast", [b.op("Max", [as_int, as_int])], to=TensorProto.FLOAT)
    b.output(b.op("Add", [back, x], outputs=["y"]))
    model = b.finish()
    cache_dir = tmp_path / "cache"
    with pytest.raises(crossrt.UnsupportedError):
        crossrt.compile(model, "cpu", cache_dir=cache_dir)
    assert _crm_files(cache_dir) == []
    first = crossrt.compile(model, "cpu", cache_dir=cache_dir, fallback="cpu")
    again = crossrt.compile(model, "cpu", cache_dir=cache_dir, fallback=["cpu"])
    assert _cache(cache_dir).stats.hits == 1
    drivers = [n.driver for n in again.nodes]
    assert drivers == [n.driver for n in first.nodes] == ["onnxruntime", "reference", "onnxruntime"]
    want = np.maximum(X, 0).astype(np.int16).astype(np.float32) + X
    np.testing.assert_array_equal(_run(again), want)


def test_older_version_is_rebuilt_and_newer_is_an_error(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    crossrt.compile(_model(0), "cpu", cache_dir=cache_dir, cache_version=1)
    (old,) = _crm_files(cache_dir)
    exe = crossrt.compile(_model(0), "cpu", cache_dir=cache_dir, cache_version=2)
    stats = _cache(cache_dir, 2).stats
    assert (stats.misses, stats.rebuilds) == (1, 1)
    (new,) = _crm_files(cache_dir)  # overwritten: one entry for the model on this target
    assert new != old and not old.exists()
    assert [e.version for e in CompileCache(cache_dir).entries()] == [2]
    np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)

    with pytest.raises(InvalidArgumentError) as info:
        crossrt.compile(_model(0), "cpu", cache_dir=cache_dir, cache_version=1)
    assert info.value.code is StatusCode.INVALID
    assert "holds version 2" in info.value.message and "version 1 was asked" in info.value.message
    assert "raise the cache version" in info.value.message
    assert info.value.details == {"cached_version": 2, "requested_version": 1}
    assert _crm_files(cache_dir) == [new]
    # The same version hits; another model is not affected by this model's version.
    crossrt.compile(_model(0), "cpu", cache_dir=cache_dir, cache_version=2)
    assert _cache(cache_dir, 2).stats.hits == 1
    crossrt.compile(_model(1), "cpu", cache_dir=cache_dir, cache_version=1)


def test_newer_version_error_comes_before_validating_the_file(
    tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_dir = tmp_path / "cache"
    crossrt.compile(model_file, "cpu", cache_dir=cache_dir, cache_version=3)
    monkeypatch.setattr("crossrt.model.model._validate", pytest.fail)
    with pytest.raises(InvalidArgumentError, match="holds version 3"):
        crossrt.compile(model_file, "cpu", cache_dir=cache_dir, cache_version=0)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_entry_is_rebuilt_with_a_warning(
    tmp_path: Path, model_file: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    cache_dir = tmp_path / "cache"
    crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    (crm,) = _crm_files(cache_dir)
    data = bytearray(crm.read_bytes())
    if damage == "flip":
        for i in range(len(data) - 40, len(data) - 8):  # inside the artifact section
            data[i] ^= 0xFF
    else:
        del data[len(data) // 2 :]
    crm.write_bytes(bytes(data))
    assert [e.key for e, _ in CompileCache(cache_dir).verify()] == [crm.stem]

    with caplog.at_level(logging.WARNING, logger="crossrt"):
        exe = crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("corrupt" in w and crm.stem[:12] in w for w in warnings), warnings
    stats = _cache(cache_dir).stats
    assert (stats.hits, stats.misses, stats.rebuilds) == (0, 2, 1)
    np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)
    assert CompileCache(cache_dir).verify() == []  # the rebuilt entry is whole
    crossrt.compile(model_file, "cpu", cache_dir=cache_dir)
    assert _cache(cache_dir).stats.hits == 1


def test_lru_eviction_honours_the_budget(tmp_path: Path) -> None:
    drv, dev = resolve_device("cpu", "onnxruntime")
    opts = crossrt.drivers.CompileOptions()
    cache = CompileCache(tmp_path / "cache")

    def get(seed: int) -> crossrt.Executable:
        return cache.get_or_compile(
            _model(seed, f"m{seed}"), drv, dev, opts, lambda m: crossrt.compile(m, "cpu")
        )

    get(0)
    get(1)
    sizes = {e.model: e.size for e in cache.entries()}
    cache.max_bytes = sizes["m0"] + sizes["m1"] + max(sizes.values()) // 2  # room for two
    get(0)  # m0 is now used more recently than m1
    get(2)
    assert sorted(e.model for e in cache.entries()) == ["m0", "m2"]
    assert cache.size() <= cache.max_bytes
    assert cache.stats.evictions == 1
    assert [e.model for e in cache.entries()] == ["m0", "m2"]  # least recently used first
    get(1)  # rebuilt; evicts m0, now the least recently used
    assert sorted(e.model for e in cache.entries()) == ["m1", "m2"]
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (1, 4, 2)
    assert len(cache.prune(0)) == 2 and cache.entries() == []


def test_export_import_round_trip(tmp_path: Path, model_file: Path) -> None:
    source = _cache(tmp_path / "a")
    crossrt.compile(model_file, "cpu", cache_dir=source.directory)
    (entry,) = source.entries()
    data = source.export_entry(entry.key[:8])  # a unique prefix names the entry
    assert data == entry.path.read_bytes()
    np.testing.assert_allclose(_run(crossrt.load_executable(data)), _expected(0), rtol=1e-6)

    target = _cache(tmp_path / "b")
    assert target.import_entry(data) == entry.key
    exe = crossrt.compile(model_file, "cpu", cache_dir=target.directory)
    assert (target.stats.hits, target.stats.misses) == (1, 0)
    np.testing.assert_allclose(_run(exe), _expected(0), rtol=1e-6)

    damaged = bytearray(data)
    damaged[-20] ^= 0xFF
    with pytest.raises(InvalidContainerError):
        CompileCache(tmp_path / "c").import_entry(damaged)
    assert _crm_files(tmp_path / "c") == []
    with pytest.raises(InvalidArgumentError) as info:
        target.export_entry("ffff" if not entry.key.startswith("ffff") else "0000")
    assert info.value.code is StatusCode.NOT_FOUND


def test_cache_dir_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CROSSRT_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    crossrt.compile(_model(0), "cpu")
    assert list(tmp_path.iterdir()) == []  # no directory named, none in the environment
    monkeypatch.setenv("CROSSRT_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("CROSSRT_CACHE_MAX_SIZE", "1G")
    crossrt.compile(_model(0), "cpu")
    assert len(_crm_files(tmp_path / "env")) == 1
    assert _cache(tmp_path / "env").max_bytes == 1 << 30


def test_sizes_and_bad_arguments(tmp_path: Path) -> None:
    assert [parse_size(s) for s in ("500M", "2G", "1048576", "1.5K", "3 MiB")] == [
        500 << 20,
        2 << 30,
        1 << 20,
        1536,
        3 << 20,
    ]
    with pytest.raises(crossrt.InvalidOptionError, match="CROSSRT_CACHE_MAX_SIZE"):
        _ = settings({"CROSSRT_CACHE_MAX_SIZE": "lots"}).cache_max_bytes
    with pytest.raises(InvalidArgumentError, match="version"):
        CompileCache(tmp_path, version=-1)
    with pytest.raises(InvalidArgumentError, match="max_bytes"):
        CompileCache(tmp_path, max_bytes=-5)
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidArgumentError, match="writable directory"):
        CompileCache(tmp_path / "file" / "cache")


_WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import crossrt
    from crossrt.compiler.cache import shared_cache

    model, cache_dir = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    exe = crossrt.compile(model, "cpu", cache_dir=cache_dir)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    with crossrt.Runtime() as rt:
        y = rt.load(exe).run({"x": x})["y"]
    stats = shared_cache(cache_dir).stats
    print(json.dumps({"hits": stats.hits, "misses": stats.misses, "y": y.tolist()}))
    """
)


PROCESSES = 2  # one compiles, one waits for its entry; each costs a second of CPU on 2 cores


def test_processes_compiling_one_model_at_once_leave_one_entry(
    tmp_path: Path, model_file: Path
) -> None:
    cache_dir = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSRT_CACHE")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(model_file), str(cache_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(PROCESSES)
    ]
    try:
        # Start them together: each has imported crossrt and waits for "go".
        assert [p.stdout.readline().strip() for p in procs if p.stdout] == ["ready"] * PROCESSES
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    # One process compiled; the others waited for it and loaded its entry.
    assert sum(r["misses"] for r in results) == 1
    assert sum(r["hits"] for r in results) == PROCESSES - 1
    assert len(_crm_files(cache_dir)) == 1
    assert CompileCache(cache_dir).verify() == []
    assert list(cache_dir.glob(".tmp-*")) == []
    outputs = [np.asarray(r["y"], dtype=np.float32) for r in results]
    for y in outputs:
        np.testing.assert_array_equal(y, outputs[0])
    np.testing.assert_allclose(outputs[0], _expected(0), rtol=1e-6)


def test_process_wide_stats_add_up_across_caches(tmp_path: Path) -> None:
    before = cache_module.cache_stats()
    crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "a")
    crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "b")
    crossrt.compile(_model(0), "cpu", cache_dir=tmp_path / "b")
    after = cache_module.cache_stats().to_dict()
    delta = {k: after[k] - v for k, v in before.to_dict().items()}
    assert (delta["hits"], delta["misses"]) == (1, 2)
    assert delta["compile_seconds"] > 0
