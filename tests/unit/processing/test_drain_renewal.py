"""The drain renews the reconciliation lease between batches sparsely: the first boundary
renews, later ones only once a quarter of the lease went by since the last renewal (the
process's clock decides only when to ask; the database decides the lease)."""

from __future__ import annotations

from media_usage_orchestration.processing.reconciliation import steps, walks


def test_the_drain_renews_at_its_first_boundary_then_once_a_quarter_of_the_lease_went_by(
    monkeypatch,
):
    asked = []
    monkeypatch.setattr(
        steps, "renew", lambda engine, held, seconds: asked.append(held) or f"{held}+"
    )
    now = [100.0]
    renew = walks._sparse_renewal(None, 60, clock=lambda: now[0])

    assert renew("claim") == "claim+"
    now[0] += 14.9
    assert renew("claim+") == "claim+"
    now[0] += 0.1
    assert renew("claim+") == "claim++"
    assert asked == ["claim", "claim+"]


def test_a_refused_renewal_reaches_the_walk(monkeypatch):
    monkeypatch.setattr(steps, "renew", lambda engine, held, seconds: None)
    renew = walks._sparse_renewal(None, 60, clock=lambda: 0.0)

    assert renew("claim") is None
