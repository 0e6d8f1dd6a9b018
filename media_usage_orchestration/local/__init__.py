"""Running things locally: the in-process lane (sensors evaluated and their runs executed in
this process), the daemon lane (runs launched through a persistent instance as the daemon and
the Launchpad launch them) and the bookkeeping of the project's local instance directory."""
