"""The run tags the Runs list filters on, written by ops: the collection a run is for and its
outcome (its final word)."""

import dagster as dg

from media_usage_orchestration.values.errors import InvalidIdentifierError
from media_usage_orchestration.values.identifiers import validate_identifier

OUTCOME_TAG = "media_usage/outcome"
WORKFLOW_TAG = "media_usage/workflow"
COLLECTION_TAG = "media_usage/collection"
# The run queue's one limit (deploy/dagster.yaml): runs with the same value run one at a time.
# Its value is the workflow and the collection (`reconciliation:articles`), so a collection's
# reconciliation, deletion and work never wait for each other, only for a run of their own kind.
QUEUE_TAG = "media_usage/queue"
# The collection id a sensor launched a per-collection run for (the slug can be reused).
COLLECTION_ID_TAG = "media_usage/collection_id"
# A work run's counts, written as its final word: items claimed, completed, retried, failed.
COUNT_TAGS = {
    "claimed": "media_usage/claimed",
    "completed": "media_usage/completed",
    "retry": "media_usage/retried",
    "failed": "media_usage/failed",
}
IN_FLIGHT_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
AUTOMATIC_RETRY_TAG = "dagster/retry_number"  # set by the run-retry daemon, never by operators


def queue_tags(workflow: str, slug: str) -> dict[str, str]:
    """The tags that name a per-collection run's collection and its place in the run queue."""
    return {COLLECTION_TAG: slug, QUEUE_TAG: f"{workflow}:{slug}"}


def launched_run(context: dg.OpExecutionContext) -> dg.DagsterRun | None:
    """The run as it was launched (its parent and launch tags), without a storage read in a
    real run; a directly invoked op has none of its own, so the instance is asked (it may hold
    one stored under the context's run id)."""
    try:
        return context.run
    except dg.DagsterError:  # direct invocation: no run on the context
        return context.instance.get_run_by_id(context.run_id)


def tag_run_outcome(context: dg.OpExecutionContext, outcome: str, **tags: str) -> None:
    """Tag the run with its outcome (and any other `tags`) in one write: the run's final word (a
    re-execution may carry its parent's), written without first reading the stored tags. An op
    invoked directly, without a stored run, has nothing to tag."""
    if launched_run(context) is not None:
        context.instance.add_run_tags(context.run_id, {OUTCOME_TAG: outcome, **tags})


def tag_run_collection(context: dg.OpExecutionContext, slug: str | None) -> None:
    """Tag the run with its collection's slug, however it was launched (sensor, Launchpad,
    backfill, re-execution), so the Runs filter on `media_usage/collection` finds every run of
    one collection. The first op of each per-collection job calls this; a slug that is no valid
    identifier is left untagged (the op refuses it with its own error)."""
    try:
        validate_identifier(slug, "collection slug")
    except InvalidIdentifierError:
        return
    # The slug never changes within a run: a run launched with it (every sensor run) needs no
    # write. Direct invocation without a stored run has nothing to tag.
    run = launched_run(context)
    if run is not None and run.tags.get(COLLECTION_TAG) != slug:
        context.instance.add_run_tags(context.run_id, {COLLECTION_TAG: slug})
