"""A work run that stays for the next edit (`run_loop.drain_while_work_arrives`), on both
dialects: edits committed while it waits are claimed and projected by the same call, each
burst is reported before it waits, and it ends once its linger passes with nothing due. The
waiting runs on a fake clock whose sleep is where the CMS writes."""

from media_usage_orchestration.processing.integrity.verify import verify_index
from media_usage_orchestration.processing.loop.run_loop import (
    Budget,
    Linger,
    WorkDrainEnd,
    drain_while_work_arrives,
)
from media_usage_orchestration.store.reads.probes import collection_has_due_work
from tests.support.projection import active_collection, insert_entry, work_count

BATCH = 10


class EditsWhileWaiting:
    """The run's sleep: the clock moves on, and on the given polls the CMS writes entries."""

    def __init__(self, engine, slug: str, edits_at_poll: dict[int, list[str]]) -> None:
        self.engine, self.slug, self.edits_at_poll = engine, slug, edits_at_poll
        self.now = 0.0
        self.polls = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.polls += 1
        for content_id in self.edits_at_poll.get(self.polls, []):
            insert_entry(self.engine, self.slug, content_id)


def test_edits_made_while_the_run_waits_are_projected_by_the_same_run(db):
    articles = active_collection(db.engine, "articles")
    for index in range(3):
        insert_entry(db.engine, "articles", f"first-{index}")
    waiting = EditsWhileWaiting(db.engine, "articles", {2: ["second-0", "second-1"], 5: ["third"]})
    bursts = []

    drained = drain_while_work_arrives(
        db.engine,
        Budget(1000, 600, clock=waiting.clock),
        BATCH,
        articles.id,
        Linger(3.0, poll_seconds=0.5, sleep=waiting.sleep),
        on_burst=bursts.append,
    )

    assert [burst.counts.completed for burst in bursts] == [3, 2, 1]
    assert all(burst.stopped_by is WorkDrainEnd.NOTHING_DUE for burst in bursts)
    assert (drained.counts.claimed, drained.counts.completed) == (6, 6)
    assert drained.completed_by_collection == {(articles.id, "articles"): 6}
    # After the last edit (poll 5, t=2.5 s) it waited its whole 3 s linger: 6 more polls.
    assert (waiting.polls, waiting.now) == (11, 5.5)
    assert work_count(db.engine) == 0
    assert not verify_index(db.engine).has_drift


def test_only_the_runs_own_collection_is_waited_for_and_drained(db):
    articles = active_collection(db.engine, "articles")
    active_collection(db.engine, "pages")
    insert_entry(db.engine, "articles", "a-0")
    waiting = EditsWhileWaiting(db.engine, "pages", {1: ["p-0"]})

    drained = drain_while_work_arrives(
        db.engine,
        Budget(1000, 600, clock=waiting.clock),
        BATCH,
        articles.id,
        Linger(1.0, poll_seconds=0.5, sleep=waiting.sleep),
        on_burst=lambda burst: None,
    )

    assert drained.completed_by_collection == {(articles.id, "articles"): 1}
    assert waiting.polls == 2  # the pages edit never woke it
    assert work_count(db.engine) == 1  # the pages entry, left to its own run
    assert collection_has_due_work(db.engine, articles.id) is False


def test_the_due_probe_sees_each_state_of_one_collection(db):
    articles = active_collection(db.engine, "articles")
    assert collection_has_due_work(db.engine, articles.id) is False
    insert_entry(db.engine, "articles", "a-0")
    assert collection_has_due_work(db.engine, articles.id) is True
    assert collection_has_due_work(db.engine, "01NOSUCHCOLLECTION00000000") is False
