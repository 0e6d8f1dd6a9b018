"""Bounded reads, each one statement or one short read transaction: the sensors' and the schedule's
probes, each collection's work queue, what each collection's index holds (coverage), and the
verify oracle's reads."""
