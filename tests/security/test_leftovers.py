"""Nothing left behind after kill -9 (issue 13 item 5): the onnxruntime driver's spilled
artifacts (``/dev/shm/crossrt-artifact-*.bin``, up to the weights' size) and its compile
folders (``crossrt-ort-*`` in the temporary directory, up to the model's size) carry their
owner's PID; the next process to spill or compile removes those of owners that are gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from crossrt.drivers.onnxruntime import spill
from crossrt.drivers.onnxruntime.driver import COMPILE_PREFIX

MODEL = """
import numpy as np
import crossrt
b = crossrt.GraphBuilder("wide")
x = b.input("x", "float32", [1, 256])
w = b.constant(np.ones((256, 1024), np.float32), "W")
b.output(b.op("MatMul", [x, w], outputs=["y"]))
model = b.finish()
"""


def _child(code: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp), "CROSSRT_CACHE_DIR": str(tmp / "cache")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _named(folder: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(prefix))


def test_a_spill_left_by_a_killed_load_is_removed_by_the_next_process(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    killed = _child(
        f"""
        import os, signal
        from pathlib import Path
        from crossrt.drivers.onnxruntime import spill
        spill.SHM = Path({str(shm)!r})
        with spill.spilled(b"weights" * 1000) as file:
            print(file.path, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # as kill -9 during a load
        """,
        tmp_path,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (left,) = _named(shm, spill.PREFIX)
    assert killed.stdout.strip().endswith(left)
    nextone = _child(
        f"""
        from pathlib import Path
        from crossrt.drivers.onnxruntime import spill
        spill.SHM = Path({str(shm)!r})
        with spill.spilled(b"other") as file:
            pass
        """,
        tmp_path,
    )
    assert nextone.returncode == 0, nextone.stderr
    assert _named(shm, spill.PREFIX) == []


def test_a_compile_folder_left_by_a_killed_compile_is_removed_by_the_next(tmp_path: Path) -> None:
    killed = _child(
        MODEL
        + """
import os, signal
from crossrt.drivers.onnxruntime import driver
def die(*args, **kwargs):  # as kill -9 while ORT writes the optimized model in its folder
    os.kill(os.getpid(), signal.SIGKILL)
driver._save_options = die
crossrt.compile(model, "cpu", driver="onnxruntime")
""",
        tmp_path,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(_named(tmp_path, COMPILE_PREFIX)) == 1
    compiled = _child(MODEL + '\ncrossrt.compile(model, "cpu", driver="onnxruntime")\n', tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    assert _named(tmp_path, COMPILE_PREFIX) == []


def test_a_living_owners_files_are_kept(tmp_path: Path) -> None:
    mine = tmp_path / f"{spill.owned(spill.PREFIX)}abc.bin"
    mine.write_bytes(b"in use")
    spill.sweep.cache_clear()
    try:
        assert spill.sweep(spill.PREFIX, (str(tmp_path),)) == []
    finally:
        spill.sweep.cache_clear()
    assert mine.exists()


@pytest.mark.parametrize("name", ["crossrt-artifact-x-1-a.bin", "crossrt-artifact-1-1-a.bin"])
def test_names_of_another_namespace_or_shape_are_not_judged(tmp_path: Path, name: str) -> None:
    other = tmp_path / name  # "1" is not this namespace's inode, "x" no number at all
    other.write_bytes(b"?")
    spill.sweep.cache_clear()
    try:
        assert spill.sweep(spill.PREFIX, (str(tmp_path),)) == []
    finally:
        spill.sweep.cache_clear()
    assert other.exists()
