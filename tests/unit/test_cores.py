"""Cores: usable host CPUs, CROSSRT_VISIBLE_CORES / CROSSRT_NUM_CORES, exclusive reservation
within one process. Every test has its own ``CROSSRT_RUNTIME_DIR`` (the ``runtime_dir``
fixture), so tests never see each other's locks or a user's. Ownership across processes, with
real child processes, is tested in tests/system/test_core_ownership.py.
"""

from __future__ import annotations

import concurrent.futures
import gc
import json
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import crossrt
from crossrt import InvalidArgumentError, InvalidOptionError, OutOfResourcesError, StatusCode
from crossrt import host as hostinfo
from crossrt.config import settings
from crossrt.model import GraphBuilder
from crossrt.runtime.cores import reservation as cores

pytestmark = pytest.mark.usefixtures("runtime_dir")

AFFINITY = sorted(os.sched_getaffinity(0))
HOST = hostinfo.host_cpus()
CPUS = list(HOST.cpus)
LAST = CPUS[-1]
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs two usable CPUs")
no_quota = pytest.mark.skipif(
    HOST.limit < len(CPUS), reason="a cgroup CPU quota caps how many cores may be reserved"
)

# -- CROSSRT_VISIBLE_CORES / CROSSRT_NUM_CORES syntax ------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3", (3,)), ("3-6", (3, 4, 5, 6)), ("3,4,5", (3, 4, 5)), ("3-4,5", (3, 4, 5)), (" 2 ", (2,))],
    ids=["single", "range", "list", "range-and-core", "spaces"],
)
def test_visible_cores_syntax(text, expected):
    assert settings({"CROSSRT_VISIBLE_CORES": text}).visible_cores == expected


@pytest.mark.parametrize("text", ["1,3", "0-1,3-4", "5,7"])
def test_non_contiguous_visible_cores_are_rejected(text):
    with pytest.raises(InvalidOptionError) as info:
        _ = settings({"CROSSRT_VISIBLE_CORES": text}).visible_cores
    message = info.value.message
    assert "contiguous range" in message and "is missing" in message
    first, last = text.replace("-", ",").split(",")[0], text.replace("-", ",").split(",")[-1]
    assert f"{first}-{last}" in message  # how to write it instead
    assert info.value.code is StatusCode.INVALID_OPTION


@pytest.mark.parametrize("text", ["a", "3-", "-1", "5-3", "3,,4", "1.5", "0x3", "3,3", "123456"])
def test_bad_visible_cores_are_rejected(text):
    with pytest.raises(InvalidOptionError) as info:
        _ = settings({"CROSSRT_VISIBLE_CORES": text}).visible_cores
    assert "CROSSRT_VISIBLE_CORES" in info.value.message


@pytest.mark.parametrize(("text", "expected"), [("2", 2), ("0", 0), (" 4 ", 4), ("", None)])
def test_num_cores_syntax(text, expected):
    assert settings({"CROSSRT_NUM_CORES": text}).num_cores == expected


@pytest.mark.parametrize("text", ["-1", "two", "1.5", "²", "1e3"])
def test_bad_num_cores_are_rejected(text):
    with pytest.raises(InvalidOptionError) as info:
        _ = settings({"CROSSRT_NUM_CORES": text}).num_cores
    assert "CROSSRT_NUM_CORES" in info.value.message and "whole number" in info.value.message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"visible_cores": "1,3"},
        {"visible_cores": [0, 2]},
        {"visible_cores": []},
        {"visible_cores": -1},
        {"visible_cores": True},
        {"visible_cores": 1.0},
        {"visible_cores": "x"},
        {"num_cores": -1},
        {"num_cores": "2"},
        {"num_cores": True},
    ],
    ids=repr,
)
def test_bad_arguments_are_rejected_before_anything_is_reserved(kwargs, runtime_dir):
    with pytest.raises(InvalidArgumentError) as info:
        crossrt.Runtime(**kwargs)
    assert info.value.code is StatusCode.INVALID
    assert next(iter(kwargs)) in info.value.message
    assert not runtime_dir.exists()


def test_non_contiguous_argument_says_how_to_write_it():
    with pytest.raises(InvalidArgumentError) as info:
        crossrt.Runtime(visible_cores=[1, 3])
    assert "contiguous" in info.value.message and "1-3" in info.value.message


def test_runtime_dir_defaults(monkeypatch):
    named = settings({"CROSSRT_RUNTIME_DIR": "/srv/locks", "XDG_RUNTIME_DIR": "/run/user/7"})
    assert (named.runtime_dir, named.runtime_dir_is_default) == ("/srv/locks", False)
    xdg = settings({"XDG_RUNTIME_DIR": "/run/user/7"})
    assert (xdg.runtime_dir, xdg.runtime_dir_is_default) == ("/run/user/7/crossrt", True)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert settings({}).runtime_dir == "/run/crossrt"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    assert Path(settings({}).runtime_dir).name == "crossrt-1000"


# -- usable host CPUs: affinity and cgroups --------------------------------------------------


def test_cgroup_v2_cpuset_and_nested_quota(tmp_path):
    pod = tmp_path / "kube" / "pod"
    pod.mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "kube" / "cpu.max").write_text("400000 100000\n")
    (pod / "cpu.max").write_text("150000 100000\n")
    (pod / "cpuset.cpus.effective").write_text(f"{LAST}\n")
    cpuset, quota = hostinfo.cgroup_cpu_limits(tmp_path, "0::/kube/pod\n")
    assert cpuset == {LAST} and quota == 1.5
    host = hostinfo.host_cpus(tmp_path, "0::/kube/pod\n")
    assert host == hostinfo.HostCpus((LAST,), 1)


@pytest.mark.skipif(len(AFFINITY) < 2, reason="needs two CPUs in the affinity mask")
def test_cgroup_quota_bounds_the_usable_count(tmp_path):
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    host = hostinfo.host_cpus(tmp_path, "0::/\n")
    assert host.cpus == tuple(AFFINITY) and host.limit == 1  # half a CPU rounds up to one


def test_cgroup_v1_quota_and_cpuset(tmp_path):
    cpu = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    cpuset = tmp_path / "cpuset" / "docker" / "abc"
    cpu.mkdir(parents=True)
    cpuset.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("250000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpuset / "cpuset.effective_cpus").write_text("0-3,8\n")
    text = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n3:cpuset:/docker/abc\n"
    assert hostinfo.cgroup_cpu_limits(tmp_path, text) == (frozenset({0, 1, 2, 3, 8}), 2.5)
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert hostinfo.cgroup_cpu_limits(tmp_path, text)[1] is None


def test_no_cgroup_limits(tmp_path):
    assert hostinfo.cgroup_cpu_limits(tmp_path, "0::/\n") == (None, None)
    assert hostinfo.host_cpus(tmp_path, "") == hostinfo.HostCpus(tuple(AFFINITY), len(AFFINITY))


def test_cpu_lists():
    assert hostinfo.parse_cpu_set("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert hostinfo.format_cpus([8, 0, 1, 2, 3, 10]) == "0-3,8,10"
    assert hostinfo.format_cpus([]) == "none"


# -- the default: shared, no locks -----------------------------------------------------------


def test_default_runtime_shares_every_usable_core(runtime_dir):
    host = hostinfo.host_cpus()
    with crossrt.Runtime() as rt:
        assert not rt.exclusive
        assert rt.cores == host.cpus[: host.limit]
    assert not runtime_dir.exists()  # nothing locked, nothing written


# -- exclusive ownership -----------------------------------------------------------------------


def test_a_pid_in_a_lock_file_without_the_lock_never_blocks(runtime_dir):
    runtime_dir.mkdir(mode=0o700)
    alive = {"pid": os.getppid(), "name": "x", "cmdline": "x", "started": None}
    (runtime_dir / f"cpu{LAST}.lock").write_text(json.dumps(alive))
    assert cores.core_owners() == {}
    with crossrt.Runtime(visible_cores=LAST) as rt:
        assert rt.cores == (LAST,)


@no_quota
def test_more_cores_than_usable():
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(num_cores=len(CPUS) + 1)
    err = info.value
    assert err.code is StatusCode.LOAD_NOT_ENOUGH_NC and int(err.code) == 9
    assert f"asked for {len(CPUS) + 1} cores" in err.message
    assert err.details["requested"] == len(CPUS) + 1 and err.details["usable"] == CPUS
    outside = max(CPUS) + 1
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(visible_cores=outside)
    assert info.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
    assert f"host CPU {outside} is not usable by this process" in info.value.message


# -- precedence --------------------------------------------------------------------------------


def test_visible_cores_win_over_num_cores_with_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("CROSSRT_VISIBLE_CORES", str(LAST))
    monkeypatch.setenv("CROSSRT_NUM_CORES", str(len(CPUS)))
    with caplog.at_level(logging.WARNING, logger="crossrt"), crossrt.Runtime() as rt:
        assert rt.cores == (LAST,)
    assert "CROSSRT_VISIBLE_CORES and CROSSRT_NUM_CORES are both set" in caplog.text
    assert "take precedence" in caplog.text
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="crossrt"),
        crossrt.Runtime(visible_cores=LAST, num_cores=len(CPUS)) as rt,
    ):
        assert rt.cores == (LAST,)
    assert "visible_cores and num_cores are both set" in caplog.text


@needs_two
def test_arguments_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("CROSSRT_VISIBLE_CORES", str(LAST))
    with crossrt.Runtime(num_cores=1) as rt:
        assert rt.cores == (CPUS[0],)
    monkeypatch.delenv("CROSSRT_VISIBLE_CORES")
    monkeypatch.setenv("CROSSRT_NUM_CORES", "0")
    with crossrt.Runtime(visible_cores=[CPUS[0]]) as rt:
        assert rt.cores == (CPUS[0],)


# -- within one process: shared, counted -------------------------------------------------------


def test_threads_reserve_at_once_and_share(runtime_dir):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runtimes = list(pool.map(lambda _: crossrt.Runtime(num_cores=1), range(16)))
    assert {rt.cores for rt in runtimes} == {(CPUS[0],)}
    for rt in runtimes:
        rt.close()
    assert cores.core_owners() == {}


def test_an_unclosed_runtime_gives_its_cores_back_when_collected():
    rt = crossrt.Runtime(visible_cores=LAST)
    assert LAST in cores.core_owners()
    del rt
    gc.collect()
    assert cores.core_owners() == {}


# -- core indices of a load --------------------------------------------------------------------


def test_load_core_indices_start_at_zero_within_the_reservation():
    b = GraphBuilder("add")
    x = b.input("x", "float32", [2])
    b.output(b.op("Add", [x, b.constant(np.ones(2, np.float32))], outputs=["y"]))
    exe = crossrt.compile(b.finish())
    with crossrt.Runtime(visible_cores=LAST) as rt:
        assert rt.load(exe).cores == (0,)
        loaded = rt.load(exe, cores=[0])
        np.testing.assert_array_equal(loaded.run({"x": np.zeros(2, np.float32)})["y"], [1, 1])
        with pytest.raises(InvalidArgumentError) as bad:
            rt.load(exe, cores=[1])
        assert f"host CPUs {LAST}" in bad.value.message and "from 0 to 0" in bad.value.message
        with pytest.raises(OutOfResourcesError) as many:
            rt.load(exe, cores=2)
        assert many.value.code is StatusCode.LOAD_NOT_ENOUGH_NC
        assert many.value.details == {"requested": 2, "available": 1}


# -- the runtime directory -------------------------------------------------------------------


def test_runtime_dir_is_created_private(tmp_path, monkeypatch):
    folder = tmp_path / "a" / "b"
    monkeypatch.setenv("CROSSRT_RUNTIME_DIR", str(folder))
    old = os.umask(0o022)
    try:
        with crossrt.Runtime(num_cores=1):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
            written = json.loads((folder / f"cpu{CPUS[0]}.lock").read_text())
    finally:
        os.umask(old)
    assert written["pid"] == os.getpid() and written["host_cpu"] == CPUS[0]


def test_default_runtime_dir_under_xdg_and_unsafe_one_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("CROSSRT_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    with crossrt.Runtime(num_cores=1):
        assert stat.S_IMODE((tmp_path / "xdg" / "crossrt").stat().st_mode) == 0o700
    (tmp_path / "xdg" / "crossrt").chmod(0o777)
    with pytest.raises(OutOfResourcesError) as info:
        crossrt.Runtime(num_cores=1)
    assert "writable by others" in info.value.message
    assert "CROSSRT_RUNTIME_DIR" in info.value.message
