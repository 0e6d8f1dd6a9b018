"""The projection GC's statements (`ProjectionGcRepository`): the single-flight task row (claim,
completion, failure, the operator's view of it) and the sweep's statements, each of which acts
only under the pass's live lease: candidates below the cutoff after the cursor, marking and
deleting orphan, stale and abandoned occurrences that no live write lease covers, and expired
write leases. Time moves by backdating rows, never by sleeping."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import literal, select, update

from media_usage_orchestration.store.core import schema
from media_usage_orchestration.store.projection_gc.repository import (
    GcCandidate,
    GcClaim,
    GcCounters,
    GcCursor,
    GcTarget,
    GcTaskRow,
    ProjectionGcRepository,
    scan_window_statement,
    task_is_claimable,
)
from tests.support.factories import ago, from_now, insert_occurrences, insert_row, insert_source
from tests.support.projection_gc import make_gc_due, one_task
from tests.support.states import (
    all_rows,
    backdate,
    count,
    db_now,
    one,
    recorded_statements,
    snapshot,
)

HOUR = 3600
SAFETY_WINDOW = 600
TOKEN = "01GCPASSGCPASSGCPASSGCPASS"
STRANGER = "01STRANGERSTRANGERSTRANGER"
CODE = "MEDIA_USAGE_CLEANUP_FAILED"


@pytest.fixture
def repo(db):
    return ProjectionGcRepository(db.engine)


def claim(repo, token: str = TOKEN, **durations) -> GcClaim | None:
    """Claim under `token`: a 300 s lease, a 60 s interval, the test's safety window."""
    arguments = {"lease_seconds": 300, "interval_seconds": 60}
    arguments.update({"safety_window_seconds": SAFETY_WINDOW, **durations})
    return repo.claim(token, **arguments)


def expire_lease(db) -> None:
    assert backdate(db.engine, schema.cleanup, "lease_expires_at", 1)


@pytest.fixture
def sweep(db):
    """Occurrences of every fate: `live` is indexed an hour ago at `gen-2`; the ids sort in
    (created_at, id) order."""
    insert_source(
        db.engine, "live", current_generation="gen-2", indexed_at=ago(HOUR), content_id="e"
    )
    occurrences = [
        ("a-current", "live", "gen-2", 2 * HOUR),  # its source's current generation
        ("b-stale", "live", "gen-1", 2 * HOUR - 1),  # created before the source was indexed
        ("c-held", "live", "gen-4", 2 * HOUR - 2),  # not current, but a live write lease
        ("d-orphan", "gone", "gen-5", 2 * HOUR - 3),  # no source row at all
        ("e-abandoned", "live", "gen-3", 1800),  # created after the source was indexed
        ("f-young", "gone", "gen-6", 60),  # within the safety window
    ]
    for index, (id_, source_key, generation, seconds) in enumerate(occurrences):
        insert_occurrences(
            db.engine,
            [
                {
                    "source_key": source_key,
                    "index": index,
                    "id": id_,
                    "generation": generation,
                    "created_at": ago(seconds),
                }
            ],
        )
    write_lease(db, "c-lease", "live", "gen-4", expires_in=HOUR)
    return [id_ for id_, *_ in occurrences]


def write_lease(db, token: str, source_key: str, generation: str, *, expires_in: int) -> None:
    """A generation-write lease expiring `expires_in` seconds from now (database time)."""
    row = {
        "source_key": source_key,
        "generation": generation,
        "lease_token": token,
        "expires_at": from_now(expires_in),
    }
    insert_row(db.engine, schema.generation_writes, row)


def occurrence_ids(db) -> list[str]:
    return sorted(row["id"] for row in all_rows(db.engine, schema.occurrences))


def fence_floor(db) -> str | None:
    row = one(db.engine, schema.cleanup_fence, task_key="projection_gc")
    return None if row is None else row["generation_floor"]


# --- the task row -----------------------------------------------------------------------------


def test_a_due_task_is_claimed_with_a_fresh_cutoff(db, repo):
    before = db_now(db.engine)

    claimed = claim(repo)

    assert isinstance(claimed, GcClaim)
    assert (claimed.lease_token, claimed.cursor, claimed.consecutive_failures) == (TOKEN, None, 0)
    assert before <= claimed.claimed_at <= db_now(db.engine)
    assert db_now(db.engine, -SAFETY_WINDOW - 30) < claimed.scan_before_at < claimed.claimed_at
    task = repo.read_task()
    assert isinstance(task, GcTaskRow)
    assert "lease_token" not in {field.name for field in dataclasses.fields(GcTaskRow)}
    assert (task.leased, task.cursor, task.scan_before_at) == (True, None, claimed.scan_before_at)
    assert task.last_started_at == claimed.claimed_at
    assert db_now(db.engine, 240) < task.lease_expires_at <= db_now(db.engine, 300)
    assert db_now(db.engine, 30) < task.next_eligible_at <= db_now(db.engine, 60)
    assert one_task(db.engine)["lease_token"] == TOKEN


def test_the_task_is_single_flight_and_waits_for_its_interval(db, repo):
    claim(repo)
    held = one_task(db.engine)

    assert claim(repo, STRANGER) is None  # leased by another pass
    expire_lease(db)
    assert claim(repo, STRANGER) is None  # its lease lapsed, but the interval has not
    assert one_task(db.engine)["lease_token"] == TOKEN
    make_gc_due(db.engine)

    taken = claim(repo, STRANGER)

    assert taken is not None and one_task(db.engine)["lease_token"] == STRANGER
    assert taken.scan_before_at == held["scan_before_at"]  # the sweep keeps its cutoff


def test_a_released_task_is_claimed_again_once_due(db, repo):
    claim(repo)
    assert repo.complete(TOKEN, GcCounters(), None, True)
    assert claim(repo, STRANGER) is None  # not due before its interval
    make_gc_due(db.engine)
    assert claim(repo, STRANGER) is not None


def test_the_task_is_claimable_when_due_and_not_leased(db, repo):
    def claimable() -> bool:
        with db.engine.connect() as connection:
            found = connection.execute(select(literal(1)).where(task_is_claimable()))
            return found.first() is not None

    assert claimable() is True
    claim(repo)
    assert claimable() is False
    expire_lease(db)
    make_gc_due(db.engine)
    assert claimable() is True


def test_a_pass_that_stops_mid_sweep_keeps_its_cursor_and_cutoff(db, repo):
    first = claim(repo)
    cursor = GcCursor("2026-01-01T00:00:00.000Z", "occurrence-9")
    counters = GcCounters(
        candidate_count=9,
        deleted_orphans=1,
        deleted_stale=2,
        deleted_abandoned=3,
        deleted_write_leases=4,
        backlog_lower_bound=5,
        scan_has_more=True,
        duration_ms=70,
    )

    assert repo.complete(TOKEN, counters, cursor, False, due_now=True)

    task = repo.read_task()
    assert (task.leased, task.lease_expires_at, task.last_error_code) == (False, None, None)
    assert (task.cursor, task.scan_before_at) == (cursor, first.scan_before_at)
    assert (task.last_candidate_count, task.last_deleted_orphans) == (9, 1)
    assert (task.last_deleted_stale, task.last_deleted_abandoned) == (2, 3)
    assert (task.last_deleted_write_leases, task.last_backlog_lower_bound) == (4, 5)
    assert (task.last_scan_has_more, task.last_duration_ms) == (True, 70)
    assert task.next_eligible_at <= db_now(db.engine)  # due at once: more is right behind
    resumed = claim(repo, STRANGER)
    assert (resumed.cursor, resumed.scan_before_at) == (cursor, first.scan_before_at)


def test_a_finished_sweep_forgets_its_cursor_and_cutoff(db, repo):
    claim(repo)
    eligible = one_task(db.engine)["next_eligible_at"]

    assert repo.complete(TOKEN, GcCounters(candidate_count=3), GcCursor("t", "id"), True)

    task = repo.read_task()
    assert (task.cursor, task.scan_before_at, task.leased) == (None, None, False)
    assert (task.last_candidate_count, task.last_scan_has_more) == (3, False)
    assert task.next_eligible_at == eligible  # due when the claim said


def test_a_failure_releases_the_task_to_retry_where_it_stopped(db, repo):
    claim(repo)
    cursor = GcCursor("2026-01-01T00:00:00.000Z", "occurrence-9")
    assert repo.complete(TOKEN, GcCounters(), cursor, False, due_now=True)
    claim(repo)

    failed = repo.fail(
        TOKEN, retry_delay_seconds=120, consecutive_failures=2, duration_ms=15, error_code=CODE
    )

    assert failed is True
    task = repo.read_task()
    assert (task.leased, task.last_error_code, task.consecutive_failures) == (False, CODE, 2)
    assert (task.cursor, task.last_duration_ms) == (cursor, 15)
    assert db_now(db.engine, 90) < task.next_eligible_at <= db_now(db.engine, 120)
    assert claim(repo, STRANGER) is None  # not due before the retry delay
    make_gc_due(db.engine)
    assert claim(repo, STRANGER).consecutive_failures == 2


@pytest.mark.parametrize("how", ["wrong_token", "expired", "released"])
def test_a_pass_without_its_live_lease_releases_nothing(db, repo, how):
    claim(repo)
    token = STRANGER if how == "wrong_token" else TOKEN
    if how == "expired":
        expire_lease(db)
    if how == "released":
        assert repo.complete(TOKEN, GcCounters(), None, True)
    before = snapshot(db.engine)

    assert repo.complete(token, GcCounters(candidate_count=1), None, True) is False
    assert (
        repo.fail(
            token, retry_delay_seconds=0, consecutive_failures=1, duration_ms=1, error_code=CODE
        )
        is False
    )
    assert snapshot(db.engine) == before


@pytest.mark.parametrize(
    "durations",
    [
        {"lease_seconds": -1},
        {"interval_seconds": 1.5},
        {"safety_window_seconds": True},
        {"lease_seconds": 365 * 24 * HOUR + 1},
        {"interval_seconds": "60"},
    ],
)
def test_a_claim_with_bad_durations_is_refused_before_any_sql(db, repo, durations):
    before = snapshot(db.engine)

    with (
        recorded_statements(db.engine) as sent,
        pytest.raises(ValueError, match="whole number of seconds"),
    ):
        claim(repo, **durations)

    assert sent == []
    assert snapshot(db.engine) == before


@pytest.mark.parametrize("delay", [-5, 2.5, None, 365 * 24 * HOUR + 1])
def test_a_failure_with_a_bad_retry_delay_is_refused_before_any_sql(db, repo, delay):
    claim(repo)
    before = snapshot(db.engine)

    with (
        recorded_statements(db.engine) as sent,
        pytest.raises(ValueError, match="cleanup retry delay"),
    ):
        repo.fail(
            TOKEN,
            retry_delay_seconds=delay,
            consecutive_failures=1,
            duration_ms=1,
            error_code=CODE,
        )

    assert sent == []
    assert snapshot(db.engine) == before


def test_without_the_task_row_there_is_nothing_to_read_or_claim(db, repo):
    with db.engine.begin() as connection:
        connection.execute(schema.cleanup.delete())

    assert repo.read_task() is None
    assert claim(repo) is None


# --- the sweep --------------------------------------------------------------------------------


def test_candidates_are_the_rows_below_the_cutoff_with_what_decides_their_fate(db, repo, sweep):
    claimed = claim(repo)

    found = repo.find_candidates(TOKEN, claimed.scan_before_at, None, 10)

    assert [candidate.id for candidate in found] == sweep[:5]  # f-young is above the cutoff
    assert all(isinstance(candidate, GcCandidate) for candidate in found)
    by_id = {candidate.id: candidate for candidate in found}
    live = one(db.engine, schema.sources, source_key="live")
    assert (by_id["b-stale"].current_generation, by_id["b-stale"].indexed_at) == (
        "gen-2",
        live["indexed_at"],
    )
    assert by_id["d-orphan"].current_generation is None and by_id["d-orphan"].indexed_at is None
    assert by_id["c-held"].write_lease_expires_at > db_now(db.engine)
    assert by_id["a-current"].write_lease_expires_at is None


def test_candidates_resume_after_the_cursor_up_to_the_limit(db, repo, sweep):
    cutoff = claim(repo).scan_before_at
    first = repo.find_candidates(TOKEN, cutoff, None, 2)
    cursor = GcCursor(first[-1].created_at, first[-1].id)

    rest = repo.find_candidates(TOKEN, cutoff, cursor, 10)

    assert [candidate.id for candidate in first] == sweep[:2]
    assert [candidate.id for candidate in rest] == sweep[2:5]
    assert repo.find_candidates(TOKEN, cutoff, None, 0) == []
    assert repo.find_candidates(TOKEN, cutoff, None, -3) == []


@pytest.mark.parametrize("how", ["wrong_token", "expired"])
def test_without_the_live_lease_a_pass_finds_and_changes_nothing(db, repo, sweep, how):
    cutoff = claim(repo).scan_before_at
    write_lease(db, "expired-lease", "gone", "gen-9", expires_in=-60)
    token = STRANGER if how == "wrong_token" else TOKEN
    if how == "expired":
        expire_lease(db)
    before = snapshot(db.engine)

    assert repo.find_candidates(token, cutoff, None, 10) == []
    for target in GcTarget:
        assert repo.mark_targets(target, sweep, cutoff, token) == 0
        assert repo.delete_marked_targets(target, sweep, cutoff, token) == 0
    assert repo.find_expired_write_leases(token, 10) == []
    assert repo.delete_expired_write_leases(token, ["expired-lease"]) == 0
    assert snapshot(db.engine) == before


def test_each_target_marks_only_its_own_kind(db, repo, sweep):
    cutoff = claim(repo).scan_before_at

    marked = {target: repo.mark_targets(target, sweep, cutoff, TOKEN) for target in GcTarget}

    assert marked == {GcTarget.ORPHAN: 1, GcTarget.STALE: 1, GcTarget.ABANDONED: 1}
    tokens = {
        row["id"]: row["cleanup_lease_token"] for row in all_rows(db.engine, schema.occurrences)
    }
    assert {id_ for id_, token in tokens.items() if token == TOKEN} == {
        "b-stale",
        "d-orphan",
        "e-abandoned",
    }
    assert tokens["c-held"] is None and tokens["f-young"] is None and tokens["a-current"] is None


def test_only_marked_rows_still_targets_are_deleted_and_the_floor_raised(db, repo, sweep):
    cutoff = claim(repo).scan_before_at
    assert repo.mark_targets(GcTarget.STALE, ["b-stale"], cutoff, TOKEN) == 1
    assert repo.mark_targets(GcTarget.ORPHAN, ["d-orphan"], cutoff, TOKEN) == 1
    # The abandoned row was never marked; the orphan's generation was published meanwhile.
    insert_source(db.engine, "gone", current_generation="gen-5", content_id="g")

    deleted = {
        target: repo.delete_marked_targets(target, sweep, cutoff, TOKEN) for target in GcTarget
    }

    assert deleted == {GcTarget.ORPHAN: 0, GcTarget.STALE: 1, GcTarget.ABANDONED: 0}
    assert occurrence_ids(db) == ["a-current", "c-held", "d-orphan", "e-abandoned", "f-young"]
    assert fence_floor(db) == "gen-1"


def test_an_expired_write_lease_no_longer_protects_its_generation(db, repo, sweep):
    cutoff = claim(repo).scan_before_at
    backdate(db.engine, schema.generation_writes, "expires_at", 1, lease_token="c-lease")

    assert repo.mark_targets(GcTarget.STALE, ["c-held"], cutoff, TOKEN) == 1
    assert repo.delete_marked_targets(GcTarget.STALE, ["c-held"], cutoff, TOKEN) == 1
    assert "c-held" not in occurrence_ids(db)
    assert fence_floor(db) == "gen-4"


def test_a_row_above_the_cutoff_is_never_reaped(db, repo, sweep):
    cutoff = claim(repo).scan_before_at
    with db.engine.begin() as connection:
        connection.execute(
            update(schema.occurrences)
            .where(schema.occurrences.c.id == "f-young")
            .values(cleanup_lease_token=TOKEN)
        )

    assert repo.mark_targets(GcTarget.ORPHAN, ["f-young"], cutoff, TOKEN) == 0
    assert repo.delete_marked_targets(GcTarget.ORPHAN, ["f-young"], cutoff, TOKEN) == 0
    assert "f-young" in occurrence_ids(db)


def test_expired_write_leases_are_found_oldest_first_and_deleted_while_expired(db, repo):
    write_lease(db, "lease-old", "a", "g1", expires_in=-120)
    write_lease(db, "lease-recent", "b", "g2", expires_in=-60)
    write_lease(db, "lease-live", "c", "g3", expires_in=HOUR)
    claim(repo)

    assert repo.find_expired_write_leases(TOKEN, 10) == ["lease-old", "lease-recent"]
    assert repo.find_expired_write_leases(TOKEN, 1) == ["lease-old"]
    assert repo.find_expired_write_leases(TOKEN, 0) == []
    assert repo.delete_expired_write_leases(TOKEN, []) == 0

    deleted = repo.delete_expired_write_leases(TOKEN, ["lease-old", "lease-recent", "lease-live"])

    assert deleted == 2
    assert [row["lease_token"] for row in all_rows(db.engine, schema.generation_writes)] == [
        "lease-live"
    ]


# --- the scan window --------------------------------------------------------------------------


def test_the_scan_window_flags_what_a_pass_would_reap(db, sweep):
    cutoff = db_now(db.engine, -SAFETY_WINDOW)

    cursor = GcCursor(one(db.engine, schema.occurrences, id="b-stale")["created_at"], "b-stale")

    with db.engine.connect() as connection:
        window = dict(connection.execute(scan_window_statement(cutoff, None, 10)).all())
        first = connection.execute(scan_window_statement(cutoff, None, 2)).all()
        rest = dict(connection.execute(scan_window_statement(cutoff, cursor, 10)).all())

    assert window == {
        "a-current": 0,
        "b-stale": 1,
        "c-held": 0,
        "d-orphan": 1,
        "e-abandoned": 1,
    }
    assert sorted(id_ for id_, _ in first) == ["a-current", "b-stale"]
    assert sorted(rest) == ["c-held", "d-orphan", "e-abandoned"]
    assert count(db.engine, schema.occurrences) == 6  # a read: nothing changed
