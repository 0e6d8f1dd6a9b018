"""What a collection's index holds right now: the numbers operators plot and read.

Read-only, one statement per number inside one read transaction. Occurrences count only the
current generation of each source (older generations are abandoned rows awaiting cleanup).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, and_, func, select

from .engine import read_transaction
from .identifiers import validate_identifier
from .schema import CONTENT_ADAPTER_ID, content_table, index_status, occurrences, sources, work


@dataclass(frozen=True)
class CollectionCoverage:
    collection_id: str
    collection_slug: str
    status: str | None
    change_epoch: int | None
    reconciliation_required: bool
    last_error_code: str | None
    started_at: str | None
    completed_at: str | None
    entries: int
    sources: int
    occurrences: int
    pending_work: int
    failed_work: int


def read_collection_coverage(engine: Engine, collection_id: str, slug: str) -> CollectionCoverage:
    validate_identifier(slug, "collection slug")
    with read_transaction(engine) as connection:
        return collection_coverage(connection, collection_id, slug)


def collection_coverage(
    connection: Connection, collection_id: str, slug: str
) -> CollectionCoverage:
    status = connection.execute(
        select(
            index_status.c.status,
            index_status.c.change_epoch,
            index_status.c.reconciliation_required,
            index_status.c.last_error_code,
            index_status.c.started_at,
            index_status.c.completed_at,
        ).where(
            index_status.c.adapter_id == CONTENT_ADAPTER_ID,
            index_status.c.scope_key == slug,
            index_status.c.collection_id == collection_id,
        )
    ).first()
    pending, failed = _work_counts(connection, collection_id)
    return CollectionCoverage(
        collection_id=collection_id,
        collection_slug=slug,
        status=status.status if status else None,
        change_epoch=status.change_epoch if status else None,
        reconciliation_required=bool(status.reconciliation_required) if status else False,
        last_error_code=status.last_error_code if status else None,
        started_at=status.started_at if status else None,
        completed_at=status.completed_at if status else None,
        entries=_count(connection, select(func.count()).select_from(content_table(slug))),
        sources=_count(
            connection,
            select(func.count()).where(sources.c.collection_id == collection_id),
        ),
        occurrences=_count(
            connection,
            select(func.count())
            .select_from(occurrences)
            .join(
                sources,
                and_(
                    sources.c.source_key == occurrences.c.source_key,
                    sources.c.current_generation == occurrences.c.generation,
                ),
            )
            .where(sources.c.collection_id == collection_id),
        ),
        pending_work=pending,
        failed_work=failed,
    )


def _count(connection: Connection, statement) -> int:
    return int(connection.execute(statement).scalar_one())


def _work_counts(connection: Connection, collection_id: str) -> tuple[int, int]:
    failed = work.c.state == "failed"
    row = connection.execute(
        select(
            func.count().filter(~failed),
            func.count().filter(failed),
        ).where(work.c.collection_id == collection_id)
    ).one()
    return int(row[0]), int(row[1])
