"""NNRt device IDs are derived from the device (its driver and device name), as NNRt hashes
a device's name: installing or removing a driver does not change another device's ID."""

from __future__ import annotations

import pytest

from crossrt.compat import nnrt as nn
from crossrt.drivers import registry

R = nn.OH_NN_ReturnCode


def _listed() -> dict[str, int]:
    ret, ids = nn.OH_NNDevice_GetAllDevicesID()
    assert ret == R.OH_NN_SUCCESS and ids is not None
    return {str(nn.OH_NNDevice_GetName(i)[1]): i for i in ids}


def test_ids_survive_a_driver_being_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _listed()
    assert nn.OH_NNDevice_GetAllDevicesID()[1][0] == 0  # 0: the default device, as before
    ref = before["reference/cpu:0"]
    assert ref == nn.device_id("reference") and ref != 0
    gone = [n for n in before if not n.startswith(("reference/", "onnxruntime/"))]
    if not gone:
        pytest.skip("only the reference and onnxruntime drivers are installed here")
    driver = gone[0].split("/")[0]
    monkeypatch.setattr(registry, "_statuses", None)  # a new process, as after an uninstall
    monkeypatch.setattr(registry, "_complete", None)
    monkeypatch.setenv("CROSSRT_DISABLE_DRIVERS", driver)
    after = _listed()
    assert not any(n.startswith(f"{driver}/") for n in after)
    assert after["reference/cpu:0"] == ref  # was shifted by the removed driver's devices
    assert nn.OH_NNDevice_GetName(ref) == (R.OH_NN_SUCCESS, "reference/cpu:0")
    assert nn.OH_NNDevice_GetName(before[gone[0]]) == (R.OH_NN_INVALID_PARAMETER, None)
    for name, i in after.items():
        assert before.get(name) == i, name


def test_ids_are_a_function_of_the_device_name() -> None:
    listed = _listed()
    assert len(set(listed.values())) == len(listed)
    for name, i in listed.items():
        if i != 0:
            assert i == nn.device_id(*name.split("/", 1))
