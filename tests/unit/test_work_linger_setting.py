"""`MEDIA_USAGE_WORK_LINGER_SECONDS`: unset means the default, a number of seconds from 0 to 600
is taken, anything else refuses to load with an error that names the variable."""

import pytest

from media_usage_orchestration.resources.automation import (
    DEFAULT_WORK_LINGER_SECONDS,
    WORK_LINGER_ENV,
    work_linger_from_environment,
)
from media_usage_orchestration.values.errors import InvalidSettingError


def test_unset_or_blank_is_the_default(monkeypatch):
    monkeypatch.delenv(WORK_LINGER_ENV, raising=False)
    assert work_linger_from_environment() == DEFAULT_WORK_LINGER_SECONDS == 30.0
    monkeypatch.setenv(WORK_LINGER_ENV, "  ")
    assert work_linger_from_environment() == 30.0


@pytest.mark.parametrize(("text", "seconds"), [("0", 0.0), ("2.5", 2.5), ("600", 600.0)])
def test_a_number_of_seconds_in_range_is_taken(monkeypatch, text, seconds):
    monkeypatch.setenv(WORK_LINGER_ENV, text)
    assert work_linger_from_environment() == seconds


@pytest.mark.parametrize("text", ["-1", "601", "thirty", "nan", "inf"])
def test_anything_else_is_refused_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(WORK_LINGER_ENV, text)
    with pytest.raises(InvalidSettingError, match=WORK_LINGER_ENV) as refused:
        work_linger_from_environment()
    assert refused.value.code == "MEDIA_USAGE_INVALID_SETTING"
