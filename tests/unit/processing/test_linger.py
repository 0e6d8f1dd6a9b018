"""A drained work run's wait for more work (`run_loop.Linger`), on a fake clock: it asks every
half second, returns as soon as work is due, and gives up after its seconds or its budget."""

import pytest

from media_usage_orchestration.processing.loop.run_loop import Budget, Linger


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _waiting(clock: FakeClock, seconds: float, budget_seconds: float = 600.0):
    budget = Budget(max_seconds=budget_seconds, clock=clock)
    return Linger(seconds, poll_seconds=0.5, sleep=clock.sleep), budget


def test_it_returns_at_the_first_poll_that_finds_due_work():
    clock = FakeClock()
    linger, budget = _waiting(clock, 30)
    answers = iter([False, False, True])
    assert linger.wait_for_work(budget, lambda: next(answers)) is True
    assert clock.slept == [0.5, 0.5, 0.5]


def test_without_work_it_gives_up_after_its_seconds_asking_every_half_second():
    clock = FakeClock()
    linger, budget = _waiting(clock, 2.2)
    asked = []
    assert linger.wait_for_work(budget, lambda: asked.append(clock.now) or False) is False
    assert clock.slept == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.2])
    assert len(asked) == 5 and clock.now - 100.0 == pytest.approx(2.2)


def test_a_spent_budget_ends_the_wait_before_the_linger_does():
    clock = FakeClock()
    linger, budget = _waiting(clock, 30, budget_seconds=1.0)
    assert linger.wait_for_work(budget, lambda: False) is False
    assert sum(clock.slept) == 1.0


def test_no_linger_means_no_wait_and_no_question():
    clock = FakeClock()
    linger, budget = _waiting(clock, 0)
    assert linger.wait_for_work(budget, lambda: 1 / 0) is False
    assert clock.slept == []
