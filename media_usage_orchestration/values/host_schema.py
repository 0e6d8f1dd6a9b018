"""The host-schema contract: which of EmDash's migrations this project implements.

EmDash records every migration it ran in `_emdash_migrations` (one row per name). Its
migrator owns the media usage tables; this project writes to them, so it must know every media
usage migration EmDash ran on the database:

- one it does not know (a later EmDash) may have changed what a guarded write must assert:
  every writer refuses until the project is upgraded;
- one it knows that is missing (an older EmDash) means EmDash will still create or change these
  tables: `media-usage init` refuses to create them in EmDash's place.

A media usage migration is one whose name contains `media_usage`: every EmDash migration that
touches a media usage table is named so (046, 050, 052, 061, 062, 063, 065 and 066 of EmDash
0.34.0), and `media_upload_attempts` or `media_status` are not. A database without
`_emdash_migrations` (the demo's, a test's) is not EmDash-managed: there is no contract to
check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# EmDash core (the `emdash` package, release tag `emdash@0.34.0`) whose media usage migrations
# the project implements; its migrations run up to `070_collection_routable`.
EMDASH_RELEASE = "0.34.0"
MEDIA_USAGE_MIGRATIONS = (
    "046_media_usage_index",
    "050_media_usage_index_status",
    "052_media_usage_read_index",
    "061_media_usage_cleanup",
    "062_media_usage_cleanup_fence",
    "063_media_usage_incremental_work",
    "065_media_usage_collection_deletion",
    "066_media_usage_reconciliation",
)
MEDIA_USAGE_MARKER = "media_usage"
_UPGRADE_PROJECT = "upgrade media_usage_orchestration to a release made for that EmDash"


def is_media_usage_migration(name: str) -> bool:
    return MEDIA_USAGE_MARKER in name


@dataclass(frozen=True)
class HostSchema:
    """What a database's `_emdash_migrations` says; `recorded` is None without that table."""

    recorded: tuple[str, ...] | None

    @classmethod
    def from_names(cls, names: Iterable[str] | None) -> HostSchema:
        return cls(None if names is None else tuple(sorted(names)))

    @property
    def tracked(self) -> bool:
        """The database records EmDash's migrations (EmDash created it)."""
        return self.recorded is not None

    @property
    def media_usage(self) -> tuple[str, ...]:
        return tuple(name for name in self.recorded or () if is_media_usage_migration(name))

    @property
    def known(self) -> tuple[str, ...]:
        return tuple(name for name in self.media_usage if name in MEDIA_USAGE_MIGRATIONS)

    @property
    def unknown(self) -> tuple[str, ...]:
        """Media usage migrations of a later EmDash: every writer refuses."""
        return tuple(name for name in self.media_usage if name not in MEDIA_USAGE_MIGRATIONS)

    @property
    def missing(self) -> tuple[str, ...]:
        """Known media usage migrations EmDash has not run yet (an older EmDash)."""
        if self.recorded is None:
            return ()
        return tuple(name for name in MEDIA_USAGE_MIGRATIONS if name not in self.recorded)

    def write_refusal(self) -> str | None:
        """The one line every writer refuses with, or None when writing is allowed."""
        if not self.unknown:
            return None
        return (
            f"EmDash media usage {_migrations(self.unknown)} "
            f"{'is' if len(self.unknown) == 1 else 'are'} unknown to this media-usage, "
            f"which implements those of EmDash {EMDASH_RELEASE}: "
            f"{_UPGRADE_PROJECT}; until then nothing is written"
        )

    def install_refusal(self) -> str | None:
        """Why `media-usage init` may not create the tables (EmDash's migrator owns them), or
        None. Unknown migrations come first: they stop every writer."""
        if refusal := self.write_refusal():
            return refusal
        if not self.missing:
            return None
        return (
            f"EmDash has not run media usage {_migrations(self.missing)}: "
            f"{self.upgrade_emdash_hint()}"
        )

    def upgrade_emdash_hint(self) -> str | None:
        """What to do about missing migrations: EmDash creates its tables itself."""
        if not self.missing:
            return None
        return (
            f"upgrade EmDash to {EMDASH_RELEASE} and let its migrator run "
            "(it owns the media usage tables), then run `media-usage init`"
        )

    def summary(self) -> str:
        """One line for `media-usage status`."""
        if self.recorded is None:
            return "EmDash migrations: none recorded (no _emdash_migrations table)"
        return (
            f"EmDash migrations: {len(self.recorded)} recorded, "
            f"{len(self.media_usage)} of media usage; known {len(self.known)} of "
            f"{len(MEDIA_USAGE_MIGRATIONS)} (EmDash {EMDASH_RELEASE}); "
            f"unknown: {_names(self.unknown)}; missing: {_names(self.missing)}"
        )


def _migrations(names: tuple[str, ...]) -> str:
    noun = "migration" if len(names) == 1 else "migrations"
    return f"{noun} {', '.join(names)}"


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"
