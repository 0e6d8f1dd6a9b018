"""Faults staged with a row trigger, on either dialect: a concurrent writer acting between two
statements of the code under test, a lost update, a crash at one statement.

One definition compiles to a SQLite trigger or to a plpgsql function plus trigger in the
test's own PostgreSQL schema. `when` and `action` are SQL that both dialects accept (they may
use OLD.<column> and NEW.<column>); `IGNORE` and `Abort` are the two actions whose spelling
differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text

IGNORE = "ignore"
"""Skip the row's change: the statement goes on as if the row had not matched (SQLite's
RAISE(IGNORE), a BEFORE trigger returning NULL on PostgreSQL)."""


@dataclass(frozen=True)
class Abort:
    """Fail the statement with `message` (RAISE(ABORT) / RAISE EXCEPTION)."""

    message: str


Action = str | Abort


def create_trigger(
    engine: Engine, name: str, *, table: str, event: str, action: Action, when: str | None = None
) -> None:
    """A FOR EACH ROW trigger `name` firing on `event` (e.g. "BEFORE UPDATE OF state") of
    `table`, running `action` for the rows matching `when`."""
    with engine.begin() as connection:
        if _is_postgres(engine):
            connection.execute(text(_postgres_function(name, event, action, when)))
            connection.execute(
                text(
                    f"CREATE TRIGGER {name} {event} ON {table} "
                    f"FOR EACH ROW EXECUTE FUNCTION {name}()"
                )
            )
        else:
            condition = f"WHEN {when} " if when else ""
            connection.execute(
                text(
                    f"CREATE TRIGGER {name} {event} ON {table} FOR EACH ROW "
                    f"{condition}BEGIN {_sqlite_statement(action)}; END"
                )
            )


def drop_trigger(engine: Engine, name: str, table: str) -> None:
    with engine.begin() as connection:
        if _is_postgres(engine):
            connection.execute(text(f"DROP TRIGGER {name} ON {table}"))
            connection.execute(text(f"DROP FUNCTION {name}()"))
        else:
            connection.execute(text(f"DROP TRIGGER {name}"))


def _sqlite_statement(action: Action) -> str:
    if action == IGNORE:
        return "SELECT RAISE(IGNORE)"
    if isinstance(action, Abort):
        return f"SELECT RAISE(ABORT, '{action.message}')"
    return action


def _postgres_function(name: str, event: str, action: Action, when: str | None) -> str:
    if action == IGNORE:
        statement = "RETURN NULL"
    elif isinstance(action, Abort):
        statement = f"RAISE EXCEPTION '{action.message}'"
    else:
        statement = action
    guarded = f"IF {when} THEN {statement}; END IF;" if when else f"{statement};"
    return (
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$body$ BEGIN {guarded} RETURN {_passed_row(event)}; END $body$"
    )


def _passed_row(event: str) -> str:
    """What a row trigger returns to let the change proceed: the new row before an insert or
    update, the old row before a delete; an AFTER trigger's result is ignored."""
    if not event.upper().startswith("BEFORE"):
        return "NULL"
    return "OLD" if "DELETE" in event.upper() else "NEW"


def _is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"
