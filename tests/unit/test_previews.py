"""`previews.accepting` silences only the preview or beta warnings it names, only inside it."""

import warnings

import dagster as dg

from media_usage_orchestration.previews import OBSERVABLE_SOURCES, accepting


def _warned(*emitted: Warning) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for warning in emitted:
            warnings.warn(warning, stacklevel=1)
    return [str(record.message) for record in caught]


def test_a_named_preview_warning_is_silenced_inside_and_shown_outside():
    named = dg.BetaWarning(OBSERVABLE_SOURCES + " and may change.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accepting(OBSERVABLE_SOURCES):
            warnings.warn(named, stacklevel=1)
        inside = len(caught)
        warnings.warn(named, stacklevel=1)
    assert inside == 0
    assert [str(record.message) for record in caught] == [str(named)]


def test_any_other_warning_still_shows_inside():
    other = dg.BetaWarning("Parameter `x` of initializer `Y` is currently in beta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accepting(OBSERVABLE_SOURCES):
            warnings.warn(other, stacklevel=1)
            warnings.warn(UserWarning("unrelated"), stacklevel=1)
    assert [str(record.message) for record in caught] == [str(other), "unrelated"]


def test_the_helper_records_what_it_emits():
    assert _warned(UserWarning("seen")) == ["seen"]
