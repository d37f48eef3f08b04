"""The driver contract (``crossrt/drivers/base.py``), checked on every available driver.

One suite, parametrized over ``crossrt.drivers.driver_statuses()``: a driver registered later is
tested with no edit here. Each test runs on the driver's first device, at two levels:

- the driver itself (``Driver`` and ``Program`` called directly): devices, "which nodes can
  you run", options, compile, load, run, bind, close, cancellation, the memory hooks,
  damaged artifacts;
- through the runtime (``crossrt.compile(..., driver=name)`` then ``Runtime().load``): runs,
  queued runs, requests, outputs on the device, what moves between memories and how it is
  counted, execution timeouts, unloading.

What a driver is known to fail is data: ``contract_expected.toml`` has a table per driver,
``test_function_name = "reason"``. Such a test is a strict expected failure: when it passes,
the suite fails, so that a fix is noticed and its entry removed.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import crossrt
from crossrt.drivers import DriverStatus, get_driver, parse_device, resolve_device
from crossrt.drivers.base import (
    CancelToken,
    CompileOptions,
    CoreSet,
    DeviceInfo,
    DeviceKind,
    Driver,
    PerformanceMode,
    Priority,
    Program,
)
from crossrt.errors import StatusCode
from crossrt.runtime.memory.allocator import allocator_for
from crossrt.runtime.memory.transfer import TransferStats

from .contract_helpers import (
    CASES,
    DENSE,
    DYNAMIC,
    OPTIONS,
    STATIC,
    TWO_OUTPUTS,
    Held,
    Place,
    artifact,
    check_results,
    host_bytes,
    load_expected,
    other_device,
    own_memory,
    unknown_op_model,
)

THREADS = 8


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per available driver (per pair of drivers for a test that takes
    ``other_name``); the expected failures file marks some of them: an entry
    ``test_name`` marks the driver's every test of that name, ``"test_name[other]"`` only
    the one paired with driver ``other``."""
    if "driver_name" not in metafunc.fixturenames:
        return
    expected = load_expected()
    test = metafunc.function.__name__
    statuses = crossrt.drivers.driver_statuses()
    params = []
    for status in statuses:
        if "other_name" not in metafunc.fixturenames:
            marks = _marks(status, None, expected.get(status.name, {}).get(test))
            params.append(pytest.param(status.name, marks=marks, id=status.name))
            continue
        for other in statuses:
            if other.name != status.name:
                table = expected.get(status.name, {})
                reason = table.get(f"{test}[{other.name}]", table.get(test))
                marks = _marks(status, other, reason)
                params.append(
                    pytest.param(
                        status.name, other.name, marks=marks, id=f"{status.name}-{other.name}"
                    )
                )
    names = "driver_name" if "other_name" not in metafunc.fixturenames else "driver_name,other_name"
    metafunc.parametrize(names, params)


def _marks(status: DriverStatus, other: DriverStatus | None, reason: str | None) -> list[Any]:
    marks: list[Any] = []
    for each in (status, other) if other is not None else (status,):
        if each.driver is None:
            marks.append(pytest.mark.skip(reason=f"{each.name} unavailable: {each.reason}"))
        elif not each.driver.devices():
            marks.append(pytest.mark.skip(reason=f"{each.name} serves no device here"))
    if reason is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    return marks


@pytest.fixture
def driver(driver_name: str) -> Driver:
    return get_driver(driver_name)


@pytest.fixture
def device(driver: Driver) -> DeviceInfo:
    return driver.devices()[0]


@pytest.fixture
def place(driver: Driver, device: DeviceInfo) -> Place:
    return Place(driver, device)


def _load(driver: Driver, device: DeviceInfo, case: str, cores: int = 1) -> Program:
    art = artifact(driver.name, case)
    return driver.load(art, device, CoreSet(tuple(range(cores))), OPTIONS)


def test_the_expected_failures_name_tests_of_this_suite() -> None:
    tests = {name for name in globals() if name.startswith("test_")}
    for driver, table in load_expected().items():
        unknown = sorted(key for key in table if key.partition("[")[0] not in tests)
        assert not unknown, f"contract_expected.toml [{driver}] names no test here: {unknown}"


# -- devices, nodes, options ------------------------------------------------------------------


def test_devices_describe_themselves(driver: Driver, driver_name: str) -> None:
    assert isinstance(driver.version, str) and driver.version
    devices = driver.devices()
    ids = [d.id for d in devices]
    assert len(set(ids)) == len(ids), f"device ids repeat: {ids}"
    for info in devices:
        assert info.driver == driver_name
        kind, index = parse_device(info.id)
        assert kind and index is not None, f"{info.id} is not KIND:INDEX"
        assert isinstance(info.kind, DeviceKind)
        assert info.cores >= 1 and info.memory_bytes > 0
        assert all(link != info.id for link in info.links)
        assert resolve_device(info.id, driver_name)[1] == info
        json.dumps(info.to_dict())


def test_supported_nodes_answers_node_by_node(driver: Driver, device: DeviceInfo) -> None:
    dense = DENSE.build()
    assert driver.supported_nodes(dense, device) == [True] * len(dense.nodes)
    assert driver.unsupported_reasons(dense, device) == [None] * len(dense.nodes)
    model = unknown_op_model()
    assert driver.supported_nodes(model, device) == [True, False]
    reasons = driver.unsupported_reasons(model, device)
    assert reasons[0] is None and isinstance(reasons[1], str)
    assert "NoSuchOp" in reasons[1] or "conformance.test" in reasons[1], reasons[1]


def test_compile_refuses_a_node_it_cannot_run(driver_name: str, device: DeviceInfo) -> None:
    with pytest.raises(crossrt.UnsupportedError) as info:
        crossrt.compile(unknown_op_model(), device.id, driver=driver_name)
    assert info.value.code is StatusCode.UNSUPPORTED_OPERATOR
    assert "NoSuchOp" in info.value.message


def _unclaimed(device: DeviceInfo) -> list[tuple[str, dict[str, Any]]]:
    """Options the device's capabilities do not claim, as ``(option, compile kwargs)``."""
    caps = device.capabilities
    options: list[tuple[str, dict[str, Any]]] = []
    if not caps.fp16:
        options.append(("fp16", {"fp16": True}))
    options += [
        ("performance_mode", {"performance_mode": mode})
        for mode in PerformanceMode
        if mode not in caps.performance_modes
    ]
    if not caps.priority:
        options.append(("priority", {"priority": Priority.HIGH}))
    # No driver takes a setting of this name, whether or not it takes extensions.
    options.append(("extensions", {"extensions": {"conformance.no_such_setting": 1}}))
    return options


def test_check_options_refuses_what_the_device_does_not_claim(
    driver: Driver, device: DeviceInfo
) -> None:
    for option, kwargs in _unclaimed(device):
        with pytest.raises(crossrt.InvalidOptionError) as info:
            driver.check_options(CompileOptions(**kwargs), device)
        assert info.value.code is StatusCode.INVALID_OPTION, option
        assert option in info.value.message and driver.name in info.value.message


def test_compile_refuses_an_option_it_cannot_honour(driver_name: str, device: DeviceInfo) -> None:
    for option, kwargs in _unclaimed(device):
        with pytest.raises(crossrt.InvalidOptionError) as info:
            crossrt.compile(DENSE.build(), device.id, driver=driver_name, **kwargs)
        assert info.value.code is StatusCode.INVALID_OPTION, option
        assert option in info.value.message and driver_name in info.value.message


def test_what_the_device_claims_compiles_and_runs(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    caps = device.capabilities
    claimed = [CompileOptions(performance_mode=mode) for mode in caps.performance_modes]
    claimed += [CompileOptions(portable=True)]
    if caps.priority:
        claimed.append(CompileOptions(priority=Priority.HIGH))
    inputs = DENSE.inputs(1, 0)
    for options in claimed:
        driver.check_options(options, device)
        art = driver.compile(DENSE.build(), device, options)
        program = driver.load(art, device, CoreSet((0,)), options)
        check_results(place.run(program, inputs), DENSE.answer(inputs), str(options))
        program.close()


# -- compile, load, run -----------------------------------------------------------------------


def test_compile_gives_bytes_it_can_describe(driver: Driver) -> None:
    art = artifact(driver.name, "dense")
    assert isinstance(art, bytes) and art
    labels = driver.describe_artifact(art)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()), labels
    assert driver.describe_artifact(memoryview(art)) == labels


@pytest.mark.parametrize("case", STATIC)
def test_load_and_run_equal_numpy(
    driver: Driver, device: DeviceInfo, place: Place, case: str
) -> None:
    program = _load(driver, device, case)
    for seed in (0, 1):
        inputs = CASES[case].inputs(seed, 0)
        check_results(place.run(program, inputs), CASES[case].answer(inputs), f"seed {seed}")
    program.close()


def test_load_from_a_memoryview_on_several_cores(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    cores = CoreSet(tuple(range(min(device.cores, 2))))
    program = driver.load(memoryview(artifact(driver.name, "dense")), device, cores, OPTIONS)
    inputs = DENSE.inputs(2, 0)
    check_results(place.run(program, inputs), DENSE.answer(inputs))
    program.close()


def test_a_dynamic_batch_runs_at_every_size(
    driver: Driver, device: DeviceInfo, place: Place, rt: crossrt.Runtime
) -> None:
    if not device.capabilities.dynamic_shapes:
        pytest.skip(f"{device.id} does not claim dynamic_shapes")
    program = _load(driver, device, "dynamic_batch")
    for batch in (1, 3, 7):
        inputs = DYNAMIC.inputs(batch, batch)
        check_results(place.run(program, inputs), DYNAMIC.answer(inputs), f"batch {batch}")
    program.close()
    model = rt.load(crossrt.compile(DYNAMIC.build(), device.id, driver=driver.name))
    for batch in (2, 5):
        inputs = DYNAMIC.inputs(batch, batch)
        check_results(model.run(inputs), DYNAMIC.answer(inputs), f"runtime batch {batch}")


def test_run_writes_into_the_outputs_given(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    program = _load(driver, device, "two_outputs")
    inputs = TWO_OUTPUTS.inputs(3, 0)
    want = TWO_OUTPUTS.answer(inputs)
    feed, given = place.feed(program, inputs), place.targets(program, want)
    result = program.run(feed, given)
    assert all(result[name] is given[name] for name in given), "results are not the buffers"
    check_results(place.collect(result, keep=True), want)
    place.free(*feed.values(), *given.values())
    program.close()


def test_run_outputs_gives_the_outputs_named(
    driver: Driver, device: DeviceInfo, place: Place, rt: crossrt.Runtime
) -> None:
    inputs = TWO_OUTPUTS.inputs(4, 0)
    want = TWO_OUTPUTS.answer(inputs)
    first, second = list(want)
    if not own_memory(driver, device):  # the runtime asks it of host programs only
        program = _load(driver, device, "two_outputs")
        result = program.run_outputs(place.feed(program, inputs), [second, first])
        assert list(result) == [second, first]
        check_results(result, want)
        result = program.run_outputs(place.feed(program, inputs), [second])
        check_results(result, {second: want[second]})
        program.close()
    model = rt.load(crossrt.compile(TWO_OUTPUTS.build(), device.id, driver=driver.name))
    got = model.run(inputs, output_names=[second])
    assert list(got) == [second]
    check_results(got, {second: want[second]})


# -- bind -------------------------------------------------------------------------------------


def test_bind_runs_the_new_contents_of_the_same_memory(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    program = _load(driver, device, "dense")
    feed = place.feed(program, DENSE.inputs(0, 0))
    call = program.bind(feed)
    for seed in (4, 5, 6):
        inputs = DENSE.inputs(seed, 0)
        place.write(feed["x"], inputs["x"])
        # Outputs bind allocated belong to the binding: read, never freed here.
        check_results(place.collect(call(), keep=True), DENSE.answer(inputs), f"seed {seed}")
    del call
    place.free(*feed.values())
    program.close()


def test_bind_with_outputs_writes_them_in_place(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    program = _load(driver, device, "two_outputs")
    first = TWO_OUTPUTS.inputs(0, 0)
    feed, given = place.feed(program, first), place.targets(program, TWO_OUTPUTS.answer(first))
    call = program.bind(feed, given)
    for seed in (7, 8):
        inputs = TWO_OUTPUTS.inputs(seed, 0)
        place.write(feed["x"], inputs["x"])
        result = call()
        assert all(result[name] is given[name] for name in given)
        check_results(place.collect(given, keep=True), TWO_OUTPUTS.answer(inputs), f"seed {seed}")
    del call
    place.free(*feed.values(), *given.values())
    program.close()


def test_two_binds_coexist(driver: Driver, device: DeviceInfo, place: Place) -> None:
    program = _load(driver, device, "dense")
    a_in, b_in = DENSE.inputs(10, 0), DENSE.inputs(11, 0)
    a_feed, b_feed = place.feed(program, a_in), place.feed(program, b_in)
    a_out = place.targets(program, DENSE.answer(a_in))
    call_a = program.bind(a_feed, a_out)  # outputs given
    call_b = program.bind(b_feed)  # outputs left to the binding
    for round_ in range(3):
        a_in, b_in = DENSE.inputs(20 + round_, 0), DENSE.inputs(30 + round_, 0)
        place.write(a_feed["x"], a_in["x"])
        place.write(b_feed["x"], b_in["x"])
        call_a()
        b_result = place.collect(call_b(), keep=True)
        check_results(place.collect(a_out, keep=True), DENSE.answer(a_in), f"a, round {round_}")
        check_results(b_result, DENSE.answer(b_in), f"b, round {round_}")
    del call_a, call_b
    place.free(*a_feed.values(), *b_feed.values(), *a_out.values())
    program.close()


# -- threads, close, cancel -------------------------------------------------------------------


def test_run_is_thread_safe(driver: Driver, device: DeviceInfo, place: Place) -> None:
    program = _load(driver, device, "dense", cores=min(device.cores, 2))
    start = threading.Barrier(THREADS)

    def runs(thread: int) -> int:
        start.wait()
        for k in range(4):
            inputs = DENSE.inputs(100 * thread + k, 0)
            check_results(place.run(program, inputs), DENSE.answer(inputs), f"thread {thread}")
        return thread

    with ThreadPoolExecutor(THREADS) as pool:
        assert sorted(pool.map(runs, range(THREADS))) == list(range(THREADS))
    program.close()


def test_close_gives_everything_back(driver: Driver, device: DeviceInfo, place: Place) -> None:
    _load(driver, device, "dense").close()  # an engine's one-time set-up is not a leak
    before = Held.now(driver, device)
    program = _load(driver, device, "dense", cores=min(device.cores, 2))
    inputs = DENSE.inputs(0, 0)
    place.run(program, inputs)
    feed = place.feed(program, inputs)
    given = place.targets(program, DENSE.answer(inputs))
    program.run(feed, given)
    call = program.bind(feed)
    place.collect(call(), keep=True)
    program.run_cancellable(feed, CancelToken(), given)
    del call
    place.free(*feed.values(), *given.values())
    program.close()
    del program
    assert not Held.now(driver, device).grown_since(before)


def test_run_cancellable_runs_a_call_not_cancelled(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    program = _load(driver, device, "dense")
    inputs = DENSE.inputs(12, 0)
    feed = place.feed(program, inputs)
    token = CancelToken()
    check_results(place.collect(program.run_cancellable(feed, token)), DENSE.answer(inputs))
    assert not token.cancelled
    place.free(*feed.values())
    program.close()


def _cancelled_call(driver: Driver, device: DeviceInfo, place: Place, outputs: bool) -> None:
    """A call whose token is cancelled before it starts stops with TIMEOUT, keeps nothing,
    and the program runs on afterwards."""
    program = _load(driver, device, "dense")
    inputs = DENSE.inputs(13, 0)
    feed = place.feed(program, inputs)
    given = place.targets(program, DENSE.answer(inputs)) if outputs else None
    before = Held.now(driver, device).device_bytes
    token = CancelToken()
    token.cancel()
    try:
        with pytest.raises(crossrt.DeadlineExceededError) as info:
            program.run_cancellable(feed, token, given)
        assert info.value.code is StatusCode.TIMEOUT
        assert Held.now(driver, device).device_bytes == before, "the stopped call kept memory"
        check_results(place.run(program, inputs), DENSE.answer(inputs), "after a cancelled call")
    finally:
        place.free(*feed.values(), *(given or {}).values())
        program.close()


def test_run_cancellable_stops_a_cancelled_call(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    _cancelled_call(driver, device, place, outputs=False)


def test_run_cancellable_with_outputs_stops_a_cancelled_call(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    _cancelled_call(driver, device, place, outputs=True)


# -- the memory hooks -------------------------------------------------------------------------


def _read(driver: Driver, device: DeviceInfo, buffer: Any, nbytes: int, offset: int = 0) -> list:
    out = np.zeros(nbytes, np.uint8)
    driver.copy_out(device, host_bytes(out), buffer, offset)
    return out.tolist()


def test_memory_hooks_copy_in_out_and_between_buffers(driver: Driver, device: DeviceInfo) -> None:
    n = 64
    pattern = np.arange(n, dtype=np.uint8)
    src, dst = driver.allocate(device, n), driver.allocate(device, n)
    driver.copy_in(device, src, host_bytes(pattern))
    assert _read(driver, device, src, n) == pattern.tolist()
    assert _read(driver, device, src, 4, offset=60) == [60, 61, 62, 63]
    driver.copy_in(device, src, host_bytes(np.full(8, 255, np.uint8)), 8)
    assert _read(driver, device, src, n) == [*range(8), *[255] * 8, *range(16, n)]
    driver.copy_in(device, dst, host_bytes(np.zeros(n, np.uint8)))
    driver.copy_device(device, dst, src, 16, dst_offset=4, src_offset=12)
    assert _read(driver, device, dst, n) == [0] * 4 + [255] * 4 + [*range(16, 28)] + [0] * 44
    driver.copy_device(device, dst, src, n)
    assert _read(driver, device, dst, n) == _read(driver, device, src, n)
    empty = driver.allocate(device, 0)
    driver.free(device, empty)
    driver.free(device, src)
    driver.free(device, dst)


def test_memory_allocate_hands_out_no_stale_bytes(driver: Driver, device: DeviceInfo) -> None:
    stale = 0
    for size in (64, 4096):
        for _ in range(4):
            buffer = driver.allocate(device, size)
            driver.copy_in(device, buffer, host_bytes(np.full(size, 0xA5, np.uint8)))
            driver.free(device, buffer)
            del buffer
            again = driver.allocate(device, size)
            stale += _read(driver, device, again, size).count(0xA5) == size
            driver.free(device, again)
    assert stale == 0, f"{stale} of 8 allocations held the bytes a freed buffer was given"


def test_memory_refuses_a_bad_size(driver: Driver, device: DeviceInfo) -> None:
    for size in (-1, 2.5):
        with pytest.raises(crossrt.CrossrtError) as info:
            driver.allocate(device, size)
        assert info.value.code is StatusCode.INVALID, size


def test_memory_refuses_a_range_outside_the_buffer(driver: Driver, device: DeviceInfo) -> None:
    buffer, other = driver.allocate(device, 64), driver.allocate(device, 64)
    eight = np.zeros(8, np.uint8)
    calls = {
        "copy_in past the end": lambda: driver.copy_in(device, buffer, host_bytes(eight), 60),
        "copy_in at -1": lambda: driver.copy_in(device, buffer, host_bytes(eight), -1),
        "copy_out past the end": lambda: driver.copy_out(device, host_bytes(eight), buffer, 60),
        "copy_device of 65": lambda: driver.copy_device(device, other, buffer, 65),
        "copy_device past the end": lambda: driver.copy_device(device, other, buffer, 8, 60),
        "copy_device of -1": lambda: driver.copy_device(device, other, buffer, -1),
    }
    accepted, raw = [], []
    for what, call in calls.items():
        try:
            call()
            accepted.append(what)
        except crossrt.CrossrtError as error:
            assert error.code is StatusCode.INVALID, what
        except Exception as error:
            raw.append(f"{what}: {type(error).__name__}")
    assert not accepted and not raw, f"accepted: {accepted}; not a CrossrtError: {raw}"
    driver.free(device, buffer)
    driver.free(device, other)


def test_memory_refuses_a_freed_buffer(driver: Driver, device: DeviceInfo) -> None:
    if not own_memory(driver, device):
        pytest.skip(f"{driver.name} serves host memory on {device.id}: a buffer is a NumPy array")
    buffer = driver.allocate(device, 8)
    driver.free(device, buffer)
    for call in (
        lambda: driver.copy_in(device, buffer, host_bytes(np.zeros(8, np.uint8))),
        lambda: driver.copy_out(device, host_bytes(np.zeros(8, np.uint8)), buffer),
        lambda: driver.free(device, buffer),
    ):
        with pytest.raises(crossrt.CrossrtError) as info:
            call()
        assert info.value.code is StatusCode.INVALID_HANDLE


def _peer(driver: Driver, device: DeviceInfo) -> DeviceInfo:
    """Another device of the same driver with memory of its own, or skip."""
    found = other_device(driver, device) if own_memory(driver, device) else None
    if found is None or found[0] is not driver:
        pytest.skip(f"{driver.name} has no second device with memory of its own here")
    return found[1]


def test_memory_refuses_a_buffer_of_another_device(driver: Driver, device: DeviceInfo) -> None:
    peer = _peer(driver, device)
    buffer = driver.allocate(peer, 8)
    with pytest.raises(crossrt.CrossrtError) as info:
        driver.copy_in(device, buffer, host_bytes(np.zeros(8, np.uint8)))
    assert info.value.code is StatusCode.OPERATION_FORBIDDEN
    assert peer.id in info.value.message and device.id in info.value.message
    with pytest.raises(crossrt.CrossrtError):
        driver.free(device, buffer)
    driver.free(peer, buffer)


def test_program_refuses_an_input_on_another_device(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    program = _load(driver, device, "dense")
    if not place.wants_device(program, "x"):
        program.close()
        pytest.skip(f"{driver.name} takes its inputs in host memory")
    peer = Place(driver, _peer(driver, device))
    x = peer.upload(DENSE.inputs(0, 0)["x"])
    with pytest.raises(crossrt.InvalidInputError) as info:
        program.run({"x": x})
    assert info.value.code is StatusCode.EXEC_BAD_INPUT
    assert peer.device.id in info.value.message and device.id in info.value.message
    peer.free(x)
    program.close()


# -- artifacts it must refuse -----------------------------------------------------------------


def _refused(driver: Driver, device: DeviceInfo, damaged: bytes) -> crossrt.CrossrtError:
    with pytest.raises(crossrt.CrossrtError) as info:
        driver.load(damaged, device, CoreSet((0,)), OPTIONS).close()
    return info.value


def test_an_empty_artifact_is_refused(driver: Driver, device: DeviceInfo) -> None:
    _refused(driver, device, b"")


def test_a_truncated_artifact_is_refused(driver: Driver, device: DeviceInfo) -> None:
    art = artifact(driver.name, "dense")
    for length in (20, len(art) // 2, len(art) - 1):
        _refused(driver, device, art[:length])


def test_an_artifact_with_flipped_bytes_is_refused(driver: Driver, device: DeviceInfo) -> None:
    art = artifact(driver.name, "dense")
    _refused(driver, device, bytes(b ^ 0xFF for b in art[:64]) + art[64:])


def test_damaged_artifacts_load_or_fail_with_a_code(
    driver: Driver, device: DeviceInfo, place: Place
) -> None:
    """One byte flipped at 24 places: describing, loading and running it may succeed, since
    not every byte is checked, or fail with a CrossrtError; never with another exception."""
    art = artifact(driver.name, "dense")
    raw = []
    for k in range(24):
        at = len(art) * k // 24
        damaged = art[:at] + bytes([art[at] ^ 0xFF]) + art[at + 1 :]
        try:
            assert isinstance(driver.describe_artifact(damaged), dict)
            program = driver.load(damaged, device, CoreSet((0,)), OPTIONS)
            place.run(program, DENSE.inputs(0, 0))
            program.close()
        except crossrt.CrossrtError:
            pass
        except Exception as error:
            raw.append(f"byte {at}: {type(error).__name__}")
    assert not raw, f"not CrossrtError: {raw}"


def test_another_drivers_artifact_is_refused(
    driver: Driver, device: DeviceInfo, other_name: str
) -> None:
    _refused(driver, device, artifact(other_name, "dense"))


# -- through the runtime ----------------------------------------------------------------------


def _runtime_load(
    rt: crossrt.Runtime, driver_name: str, device: DeviceInfo, case: Any, **load: Any
) -> crossrt.LoadedModel:
    exe = crossrt.compile(case.build(), device.id, driver=driver_name)
    assert exe.device == device.id
    return rt.load(exe, **load)


def _tensors(device: DeviceInfo, arrays: dict[str, np.ndarray]) -> dict[str, crossrt.Tensor]:
    tensors = {}
    for name, array in arrays.items():
        tensors[name] = crossrt.Tensor(array.shape, array.dtype, device=device.id)
        tensors[name].write(array)
    return tensors


def test_runtime_run_run_async_and_request_equal_numpy(
    driver_name: str, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    for case in (DENSE, TWO_OUTPUTS):
        model = _runtime_load(rt, driver_name, device, case)
        inputs = [case.inputs(seed, 0) for seed in range(4)]
        check_results(model.run(inputs[0]), case.answer(inputs[0]), f"{case.name} run")
        futures = [model.run_async(feed) for feed in inputs]
        for feed, future in zip(inputs, futures, strict=True):
            check_results(future.result(), case.answer(feed), f"{case.name} run_async")
        check_results(model.request(inputs[1]).run(), case.answer(inputs[1]), "request")
        model.unload()


def test_runtime_concurrent_runs(driver_name: str, device: DeviceInfo, rt: crossrt.Runtime) -> None:
    model = _runtime_load(rt, driver_name, device, DENSE)
    start = threading.Barrier(THREADS)

    def runs(thread: int) -> None:
        start.wait()
        for k in range(4):
            inputs = DENSE.inputs(1000 + 10 * thread + k, 0)
            check_results(model.run(inputs), DENSE.answer(inputs), f"thread {thread}")

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(runs, range(THREADS)))


def _residence(driver: Driver, device: DeviceInfo, case: str) -> set[str]:
    """The names the driver's program for ``case`` wants in device memory."""
    program = _load(driver, device, case)
    names = {n for n, r in program.residence().items() if r.value == "device"}
    program.close()
    return names


def test_runtime_resident_tensors_move_nothing(
    driver_name: str, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    model = _runtime_load(rt, driver_name, device, TWO_OUTPUTS)
    inputs = TWO_OUTPUTS.inputs(40, 0)
    feed = _tensors(device, inputs)
    outputs = {
        name: crossrt.Tensor(a.shape, a.dtype, device=device.id)
        for name, a in TWO_OUTPUTS.answer(inputs).items()
    }
    for seed in (40, 41, 42):  # the first run binds, the next ones repeat the binding
        inputs = TWO_OUTPUTS.inputs(seed, 0)
        feed["x"].write(inputs["x"])
        result = model.run(feed, outputs=outputs)
        assert all(result[name] is outputs[name] for name in outputs)
        check_results({n: t.numpy() for n, t in outputs.items()}, TWO_OUTPUTS.answer(inputs))
    assert model.memory.transfer_stats() == TransferStats()
    for tensor in (*feed.values(), *outputs.values()):
        tensor.free()


def test_runtime_host_inputs_are_copied_once_each(
    driver: Driver, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    resident = _residence(driver, device, "add")
    model = _runtime_load(rt, driver.name, device, CASES["add"])
    inputs = CASES["add"].inputs(50, 0)
    check_results(model.run(inputs), CASES["add"].answer(inputs))
    nbytes = inputs["x"].nbytes  # x, y and z are all [2, 3] float32
    ins, outs = len(resident & {"x", "y"}), len(resident & {"z"})
    assert model.memory.transfer_stats() == TransferStats(
        host_to_device_bytes=ins * nbytes,
        device_to_host_bytes=outs * nbytes,
        host_to_device_copies=ins,
        device_to_host_copies=outs,
    )
    assert model.memory.summary()["transfers"]["host_to_device_copies"] == ins


def test_runtime_outputs_left_to_the_runtime_are_charged_to_the_model(
    driver_name: str, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    model = _runtime_load(rt, driver_name, device, TWO_OUTPUTS)
    inputs = TWO_OUTPUTS.inputs(60, 0)
    result = model.run(inputs, outputs={"shifted": None, "positive": None})
    assert all(isinstance(t, crossrt.Tensor) for t in result.values())
    check_results({n: t.numpy() for n, t in result.items()}, TWO_OUTPUTS.answer(inputs))
    assert model.memory.stats().allocations == 2
    for tensor in result.values():
        tensor.free()
    assert model.memory.stats().allocations == 0


def test_runtime_a_tensor_on_another_device(
    driver: Driver, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    found = other_device(driver, device)
    if found is None:
        pytest.skip("no other device with memory of its own is available")
    other = found[1]
    wanted_on_device = "x" in _residence(driver, device, "dense")
    model = _runtime_load(rt, driver.name, device, DENSE)
    inputs = DENSE.inputs(70, 0)
    x = _tensors(other, inputs)["x"]
    if wanted_on_device:  # the runtime never moves data between devices on its own
        with pytest.raises(crossrt.InvalidInputError) as info:
            model.run({"x": x})
        assert info.value.code is StatusCode.EXEC_BAD_INPUT
        assert other.id in info.value.message and device.id in info.value.message
    else:  # a program on the host: the tensor is copied out, once, and counted
        check_results(model.run({"x": x}), DENSE.answer(inputs))
        stats = model.memory.transfer_stats()
        assert (stats.device_to_host_copies, stats.device_to_host_bytes) == (1, x.byte_size)
        assert stats.host_to_device_copies == 0
    x.free()


def test_runtime_request_runs_the_new_contents(
    driver_name: str, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    model = _runtime_load(rt, driver_name, device, DENSE)
    first, second = DENSE.inputs(80, 0), DENSE.inputs(81, 0)
    feeds = [_tensors(device, first), _tensors(device, second)]
    outs = [
        {"y": crossrt.Tensor(DENSE.answer(first)["y"].shape, "float32", device=device.id)}
        for _ in feeds
    ]
    requests = [model.request(f, o) for f, o in zip(feeds, outs, strict=True)]
    for seed in (82, 84):
        contents = [DENSE.inputs(seed, 0), DENSE.inputs(seed + 1, 0)]
        for feed, new in zip(feeds, contents, strict=True):
            feed["x"].write(new["x"])
        for request in requests:
            request.run()
        for out, new in zip(outs, contents, strict=True):
            check_results({"y": out["y"].numpy()}, DENSE.answer(new), f"seed {seed}")
    for tensor in (*feeds[0].values(), *feeds[1].values(), outs[0]["y"], outs[1]["y"]):
        tensor.free()


def test_runtime_exec_timeout_stops_runs_with_timeout(
    driver_name: str, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    model = _runtime_load(rt, driver_name, device, DENSE, exec_timeout=1e-9)
    inputs = DENSE.inputs(90, 0)
    with pytest.raises(crossrt.DeadlineExceededError) as info:
        model.run(inputs)
    assert info.value.code is StatusCode.TIMEOUT
    with pytest.raises(crossrt.DeadlineExceededError) as info:
        model.run_async(inputs).result()
    assert info.value.code is StatusCode.TIMEOUT


def _timed_out_keeps_nothing(
    driver: Driver, device: DeviceInfo, rt: crossrt.Runtime, queued: bool
) -> None:
    before = Held.now(driver, device).device_bytes
    if before is None:
        pytest.skip(f"{driver.name} keeps no account of its device memory")
    model = _runtime_load(rt, driver.name, device, DENSE, exec_timeout=1e-9)
    with pytest.raises(crossrt.DeadlineExceededError):
        if queued:
            model.run_async(DENSE.inputs(91, 0)).result()
        else:
            model.run(DENSE.inputs(91, 0))
    model.unload()
    assert Held.now(driver, device).device_bytes == before, "a stopped run kept device memory"


def test_runtime_a_timed_out_run_keeps_no_device_memory(
    driver: Driver, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    _timed_out_keeps_nothing(driver, device, rt, queued=False)


def test_runtime_a_timed_out_queued_run_keeps_no_device_memory(
    driver: Driver, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    _timed_out_keeps_nothing(driver, device, rt, queued=True)


def test_runtime_unload_gives_memory_back(
    driver: Driver, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    allocator = allocator_for(device.id)
    before = (allocator.stats().bytes_in_use, Held.now(driver, device).device_bytes)
    model = _runtime_load(rt, driver.name, device, TWO_OUTPUTS)
    inputs = TWO_OUTPUTS.inputs(95, 0)
    model.run(inputs)
    for tensor in model.run(inputs, outputs={"shifted": None, "positive": None}).values():
        tensor.free()
    model.unload()
    with pytest.raises(crossrt.CrossrtError):
        model.run(inputs)
    assert (allocator.stats().bytes_in_use, Held.now(driver, device).device_bytes) == before


def test_runtime_device_arrays_in_and_out(
    driver: Driver, device: DeviceInfo, rt: crossrt.Runtime
) -> None:
    """Where the program wants device memory, what it returns for an output left to the
    runtime stays there (a tensor on the device); elsewhere it is a host tensor."""
    on_device = "y" in _residence(driver, device, "dense")
    model = _runtime_load(rt, driver.name, device, DENSE)
    inputs = DENSE.inputs(97, 0)
    feed = _tensors(device, inputs)
    y = model.run(feed, outputs={"y": None})["y"]
    assert isinstance(y, crossrt.Tensor)
    assert y.is_host is not on_device
    if on_device:
        assert y.device == device.id
    check_results({"y": y.numpy()}, DENSE.answer(inputs))
    assert model.memory.transfer_stats() == TransferStats()
    for tensor in (*feed.values(), y):
        tensor.free()
