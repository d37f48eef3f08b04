"""Performance modes mean something on each CPU driver: LOW runs on one core, MEDIUM on half,
their idle threads not spinning (onnxruntime); HIGH and EXTREME, which would change nothing,
are refused by name (docs/drivers.md, "Performance modes and priority")."""

from __future__ import annotations

import pytest

import crossrt
from crossrt import StatusCode
from crossrt.drivers import PerformanceMode
from small_models import relu


def _available(name: str) -> bool:
    return any(s.name == name and s.driver is not None for s in crossrt.drivers.driver_statuses())


def _loaded(rt: crossrt.Runtime, driver: str, mode: PerformanceMode) -> crossrt.LoadedModel:
    exe = crossrt.compile(relu(), "cpu", driver=driver, performance_mode=mode)
    return rt.load(exe, cores=2)


@pytest.mark.parametrize(
    ("mode", "threads", "spinning"),
    [
        (PerformanceMode.NONE, 2, None),  # ORT's default: spinning
        (PerformanceMode.LOW, 1, "0"),
        (PerformanceMode.MEDIUM, 1, "0"),
    ],
)
def test_onnxruntime_sessions_follow_the_mode(
    mode: PerformanceMode, threads: int, spinning: str | None
) -> None:
    if len(crossrt.host.usable_cores()) < 2:
        pytest.skip("needs 2 usable cores")
    with crossrt.Runtime() as rt:
        program = _loaded(rt, "onnxruntime", mode)._instances[0].programs[0]
        options = program.session.get_session_options()
        assert options.intra_op_num_threads == threads
        key = "session.intra_op.allow_spinning"
        entry = options.get_session_config_entry(key) if spinning is not None else None
        assert entry == spinning
        if spinning is None:
            with pytest.raises(RuntimeError, match="does not have configuration"):
                options.get_session_config_entry(key)  # unset: ORT spins


@pytest.mark.parametrize(("mode", "threads"), [(PerformanceMode.NONE, 2), (PerformanceMode.LOW, 1)])
def test_openvino_threads_follow_the_mode(mode: PerformanceMode, threads: int) -> None:
    if not _available("openvino"):
        pytest.skip("the openvino driver is not available")
    if len(crossrt.host.usable_cores()) < 2:
        pytest.skip("needs 2 usable cores")
    with crossrt.Runtime() as rt:
        program = _loaded(rt, "openvino", mode)._instances[0].programs[0]
        assert program._compiled.get_property("INFERENCE_NUM_THREADS") == threads


@pytest.mark.parametrize("mode", [PerformanceMode.HIGH, PerformanceMode.EXTREME])
@pytest.mark.parametrize("driver", ["onnxruntime", "openvino"])
def test_modes_that_would_change_nothing_are_refused(driver: str, mode: PerformanceMode) -> None:
    if not _available(driver):
        pytest.skip(f"the {driver} driver is not available")
    with pytest.raises(crossrt.InvalidOptionError) as info:
        crossrt.compile(relu(), "cpu", driver=driver, performance_mode=mode)
    assert info.value.code is StatusCode.INVALID_OPTION
    assert "performance_mode" in info.value.message and "NONE, LOW, MEDIUM" in info.value.message


def test_mode_threads() -> None:
    assert [PerformanceMode.LOW.threads(8), PerformanceMode.MEDIUM.threads(8)] == [1, 4]
    assert PerformanceMode.MEDIUM.threads(1) == 1 and PerformanceMode.NONE.threads(8) == 8
