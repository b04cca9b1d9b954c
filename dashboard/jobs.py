"""Every RQ job, in one place: RQ runs each function here by its dotted path (`dashboard.jobs.<name>`),
and each hands over at once to the area whose work it is. Jobs take ids, never objects.

| job | queue | enqueued by |
|---|---|---|
| `drain(slot_token)` | the delivery queue (PROMESA_QUEUE) | `queue.work.WorkQueue` when ready work needs a drain |
| `receiver_check(check_id, contract_url)` | the `checks` lane | `subscriptions.checks.start` |
| `replay(replay_id)` | the `repairs` lane | `operations.replays.start` (replays, discards, replays since) |

Jobs queued by an older deploy name the functions these call (`dashboard.delivery.jobs.drain`,
`dashboard.subscriptions.checks.run`, `dashboard.operations.replays.run`): those keep their paths.
"""

from __future__ import annotations

from dashboard.delivery import jobs as drains
from dashboard.operations import replays
from dashboard.subscriptions import checks

def drain(slot_token: str) -> dict:
    """Deliver what is ready until the list is empty or the time budget is spent."""
    return drains.drain(slot_token)


def receiver_check(check_id: str, contract_url: str | None = None) -> dict:
    """Send a receiver check's requests and store the results."""
    return checks.run(check_id, contract_url)


def replay(replay_id: str) -> dict:
    """Re-queue (or discard) a replay's deliveries chunk by chunk."""
    return replays.run(replay_id)
