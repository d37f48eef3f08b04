"""CROSSRT_LOG_LEVEL: applied to the crossrt logger only when set."""

from __future__ import annotations

import logging

import pytest

import crossrt
from crossrt.config import apply_log_level, settings


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
        settings({"CROSSRT_LOG_LEVEL": "loud"})
    assert "DEBUG" in info.value.message and "LOUD" in info.value.message
