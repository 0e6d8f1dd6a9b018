"""The shared loop pieces, without a database: the budget, the leased page loop, the policy."""

from __future__ import annotations

import pytest

from media_usage_orchestration.processing.loop.retry_policy import DELETION_RETRY, WORK_RETRY
from media_usage_orchestration.processing.loop.run_loop import (
    Budget,
    Page,
    PagingEnd,
    page_until_done,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_budget_grants_its_steps_then_refuses():
    budget = Budget(max_steps=2)
    assert [budget.spend() for _ in range(3)] == [True, True, False]
    assert budget.remaining_steps == 0


def test_a_budget_runs_out_at_its_deadline_unless_a_step_is_guaranteed():
    clock = Clock()
    timed, guaranteed = (
        Budget(max_seconds=5, clock=clock),
        Budget(max_seconds=5, guaranteed_steps=1, clock=clock),
    )
    clock.now += 5
    assert not timed.spend()
    assert guaranteed.spend() and not guaranteed.spend()
    assert guaranteed.elapsed_seconds() == 5


def test_a_budget_of_items_is_charged_what_was_taken():
    budget = Budget(max_steps=5)
    budget.charge(4)
    assert (budget.exhausted(), budget.remaining_steps) == (False, 1)
    budget.charge(1)
    assert budget.exhausted()


def _walk(pages: int, budget: Budget, *, renewable: bool = True):
    events: list[str] = []

    def page(lease: str) -> Page[str, int]:
        events.append(f"page {lease}")
        number = len([event for event in events if event.startswith("page")])
        return Page(number, lease, more=number < pages)

    def renew(lease: str) -> str | None:
        events.append("renew")
        return f"{lease}+" if renewable else None

    def release_now(lease: str) -> bool:
        events.append(f"release {lease}")
        return True

    paging = page_until_done("a", page, budget=budget, renew=renew, release_now=release_now)
    return paging, events


def test_pages_run_until_one_is_the_last_renewing_only_between_pages():
    paging, events = _walk(3, Budget(max_steps=10))

    assert (paging.end, paging.lease, paging.results) == (PagingEnd.DONE, "a++", (1, 2, 3))
    assert events == ["page a", "renew", "page a+", "renew", "page a++"]


def test_a_spent_budget_hands_the_lease_back_without_renewing_it_first():
    paging, events = _walk(5, Budget(max_steps=2))

    assert (paging.end, paging.results, paging.released) == (PagingEnd.BUDGET_SPENT, (1, 2), True)
    assert events == ["page a", "renew", "page a+", "release a+"]


def test_a_refused_renewal_stops_the_pages():
    paging, events = _walk(5, Budget(max_steps=10), renewable=False)

    assert (paging.end, paging.lease, paging.results) == (PagingEnd.CLAIM_LOST, "a", (1,))
    assert events == ["page a", "renew"]


@pytest.mark.parametrize("attempt_count", range(8))
def test_the_deletion_policy_never_draws_jitter(attempt_count):
    def no_draw() -> float:
        raise AssertionError("drew a random number")

    assert DELETION_RETRY.delay_seconds(attempt_count, no_draw) == min(900, 30 * 2**attempt_count)
    assert WORK_RETRY.delay_seconds(attempt_count, lambda: 0.0) == min(900, 30 * 2**attempt_count)
    assert DELETION_RETRY.is_terminal(attempt_count) is (attempt_count >= 4)
