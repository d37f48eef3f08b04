"""A path that names no regular file (a FIFO, a directory) is refused at once with a coded
error, never waited on (issue 13 item 2: load_executable on a FIFO blocked forever)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crossrt
from crossrt import CrossrtError, StatusCode


def _within(seconds: float, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised, or fail when it is still waiting."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        with open(call.path, "wb"):  # type: ignore[attr-defined]  # a writer frees the reader
            pass
        pytest.fail(f"still waiting after {seconds} s")
    return outcome[0]


def _reader(function: Callable[[str], Any], path: Path) -> Callable[[], Any]:
    def call() -> Any:
        return function(str(path))

    call.path = path  # type: ignore[attr-defined]
    return call


@pytest.mark.parametrize("load", [crossrt.load_executable, crossrt.load_model])
def test_a_fifo_is_refused_at_once(tmp_path: Path, load: Callable[[str], Any]) -> None:
    fifo = tmp_path / "model.crm"
    os.mkfifo(fifo)
    error = _within(5, _reader(load, fifo))
    assert isinstance(error, CrossrtError), error
    assert error.code is not StatusCode.NOT_FOUND  # it exists: it is the wrong kind of file
    assert "FIFO" in str(error) and "regular file" in str(error)


@pytest.mark.parametrize("load", [crossrt.load_executable, crossrt.load_model])
def test_a_directory_is_refused_as_not_a_file(tmp_path: Path, load: Callable[[str], Any]) -> None:
    with pytest.raises(CrossrtError) as caught:
        load(str(tmp_path))
    assert caught.value.code is not StatusCode.NOT_FOUND
    assert "directory" in str(caught.value)
