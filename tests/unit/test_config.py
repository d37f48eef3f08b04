"""CROSSRT_* settings: each parsed when it is read, so a malformed variable is an error where
its setting is used, never at import; CROSSRT_LOG_LEVEL applied only when set."""

from __future__ import annotations

import logging

import pytest

import crossrt
from crossrt.config import SETTINGS, Settings, apply_log_level, default_device, problems, settings
from crossrt.drivers import registry


@pytest.fixture
def crossrt_logger():
    logger = logging.getLogger("crossrt")
    before = logger.level
    yield logger
    logger.setLevel(before)


def test_log_level_is_applied_when_set(crossrt_logger) -> None:
    apply_log_level({"CROSSRT_LOG_LEVEL": "debug"})
    assert crossrt_logger.level == logging.DEBUG


def test_unset_log_level_leaves_the_application_in_charge(crossrt_logger) -> None:
    crossrt_logger.setLevel(logging.ERROR)
    apply_log_level({})
    assert crossrt_logger.level == logging.ERROR
    assert settings({}).log_level is None


def test_a_bad_log_level_is_refused_naming_the_choices() -> None:
    with pytest.raises(crossrt.InvalidOptionError) as info:
        _ = settings({"CROSSRT_LOG_LEVEL": "loud"}).log_level
    assert "DEBUG" in info.value.message and "LOUD" in info.value.message
    assert info.value.details == {"setting": "CROSSRT_LOG_LEVEL", "value": "LOUD"}


def test_applying_a_bad_log_level_changes_nothing_and_raises_nothing(crossrt_logger) -> None:
    """``import crossrt`` applies it: import must work whatever the environment holds."""
    crossrt_logger.setLevel(logging.ERROR)
    apply_log_level({"CROSSRT_LOG_LEVEL": "loud"})
    assert crossrt_logger.level == logging.ERROR


BAD = {
    "CROSSRT_LOG_LEVEL": "loud",
    "CROSSRT_VALIDATE_HASH": "maybe",
    "CROSSRT_CACHE_MAX_SIZE": "lots",
    "CROSSRT_VISIBLE_CORES": "1,3",
    "CROSSRT_NUM_CORES": "two",
    "CROSSRT_MEMLOG_MAX_SIZE": "many",
    "CROSSRT_EXEC_TIMEOUT": "soon",
    "CROSSRT_CHECK_NUMERICS": "perhaps",
    "CROSSRT_SIM": "devices=0",
    "CROSSRT_OBSERVE": "often",
    "CROSSRT_PROCESS_TAG": "tab\there",
    "CROSSRT_REFERENCE_MEMORY": "plenty",
}


def test_a_malformed_variable_spoils_only_its_own_setting() -> None:
    current = settings(BAD | {"CROSSRT_DEFAULT_DEVICE": "sim:1", "CROSSRT_CACHE_DIR": "/c"})
    assert current.default_device == "sim:1" and current.cache_dir == "/c"
    assert current.disabled_drivers == frozenset()
    for variable, attribute in SETTINGS.items():
        if variable in BAD:
            with pytest.raises(crossrt.InvalidOptionError, match=variable):
                getattr(current, attribute)


def test_problems_names_each_malformed_variable_once() -> None:
    found = problems(BAD)
    assert [e.details["setting"] for e in found] == [v for v in SETTINGS if v in BAD]
    assert all(isinstance(e, crossrt.InvalidOptionError) for e in found)
    assert problems({}) == []
    assert problems({"CROSSRT_VISIBLE_CORES": "2-3", "CROSSRT_SIM": "devices=2"}) == []


def test_every_setting_is_listed_with_its_variable() -> None:
    attributes = {name for name, value in vars(Settings).items() if hasattr(value, "__set_name__")}
    assert attributes - {"runtime_dir_is_default"} == set(SETTINGS.values())


def test_a_setting_is_read_from_the_environment_when_first_asked_for(monkeypatch) -> None:
    monkeypatch.setenv("CROSSRT_VISIBLE_CORES", "1,3")
    current = settings()  # nothing parsed yet
    monkeypatch.setenv("CROSSRT_VISIBLE_CORES", "1-3")
    assert current.visible_cores == (1, 2, 3)


@pytest.fixture
def fresh_registry(monkeypatch):
    """A registry that has loaded no driver yet, as in a new process."""
    monkeypatch.setattr(registry, "_statuses", {})
    monkeypatch.setattr(registry, "_complete", None)


def test_a_driver_whose_variable_is_malformed_raises_it_when_used(
    monkeypatch, fresh_registry
) -> None:
    monkeypatch.setenv("CROSSRT_SIM", "devices=0")
    status = registry.driver_status("sim")
    assert status is not None and status.driver is None and "CROSSRT_SIM" in status.reason
    with pytest.raises(crossrt.InvalidOptionError, match="CROSSRT_SIM"):
        registry.get_driver("sim")
    # Not left out quietly: a device another driver would serve instead says so too.
    with pytest.raises(crossrt.InvalidOptionError, match="CROSSRT_SIM"):
        registry.available_drivers()
    monkeypatch.delenv("CROSSRT_SIM")  # fixed: the next use works, without a restart
    assert registry.get_driver("sim").devices()
    assert {d.name for d in registry.available_drivers()} >= {"sim", "reference"}


def test_default_device_follows_the_environment(monkeypatch):
    # Read on every call (every tensor made without a device), through os.environ's own data.
    monkeypatch.delenv("CROSSRT_DEFAULT_DEVICE", raising=False)
    assert default_device() == "cpu"
    monkeypatch.setenv("CROSSRT_DEFAULT_DEVICE", " sim:1 ")
    assert default_device() == "sim:1" == settings().default_device
    monkeypatch.setenv("CROSSRT_DEFAULT_DEVICE", "")
    assert default_device() == "cpu"
    assert default_device({"CROSSRT_DEFAULT_DEVICE": "cpu:0"}) == "cpu:0"


def test_neuron_process_tag_is_the_tag_where_crossrt_process_tag_is_unset() -> None:
    # neuron-monitor's tag_filter selects by NEURON_PROCESS_TAG: a program tagged for it
    # keeps its tag under crossrt; CROSSRT_PROCESS_TAG, when set, wins.
    assert Settings({"NEURON_PROCESS_TAG": "neuron-app"}).process_tag == "neuron-app"
    both = {"NEURON_PROCESS_TAG": "neuron-app", "CROSSRT_PROCESS_TAG": "crossrt-app"}
    assert Settings(both).process_tag == "crossrt-app"
    with pytest.raises(crossrt.InvalidOptionError, match="NEURON_PROCESS_TAG"):
        _ = Settings({"NEURON_PROCESS_TAG": "tab\there"}).process_tag
