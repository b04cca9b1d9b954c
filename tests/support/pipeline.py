"""Driving the real pipeline inside the test process, on the test's clock."""

from __future__ import annotations

from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.delivery import jobs
from dashboard.delivery.engine import DeliveryEngine
from dashboard.delivery.worker import DeliveryWorker
from dashboard.queue import lanes
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


def run_worker(app):
    """A real RQ worker on the app's queues, as `promesa worker --burst` and the lanes' workers run it: replay jobs
    (and checks) first, then the drain jobs they start. Promesa's worker class: RQ's own can take a minute to stop."""
    work = WorkQueue.for_app(app)
    with app.app_context():  # a worker process's own context and database session
        queues = [*(lanes.queue(lane, app).name for lane in lanes.LANES), work.rq.name]
        DeliveryWorker(queues, connection=work.conn).work(burst=True)
    engine = jobs._engines.pop(id(app), None)  # a worker process keeps its engine; a test closes it
    if engine is not None:
        engine.close()
    db.session.expire_all()
