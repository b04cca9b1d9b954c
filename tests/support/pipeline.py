"""Driving the real pipeline inside the test process, on the test's clock."""

from __future__ import annotations

from dashboard.core.clock import unix
from dashboard.delivery.engine import DeliveryEngine
from dashboard.queue.work import WorkQueue


def deliver_due(app, clock, rounds: int = 20) -> int:
    """Promote what the clock says is due and drain the ready list until it is empty."""
    work = WorkQueue.for_app(app)
    attempted = 0
    for _ in range(rounds):
        work.promote_due(unix(clock.now()))
        if not work.ready_count():
            break
        attempted += DeliveryEngine(app, work, clock).drain(None, 20).attempted
    return attempted
