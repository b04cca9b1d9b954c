"""`promesa bench --long-poll` on PostgreSQL, tiny: a smoke test, not a timing test. Every pull waited on the one
web process, each event woke its own subscription's pull with its own delivery, the figures are reported, and
the run's rows are gone after."""

from __future__ import annotations

import pytest

from tests.support.bench_runs import bench_on_postgres


@pytest.mark.slow
@pytest.mark.postgres
def test_the_long_poll_run_wakes_each_waiting_pull_with_its_own_delivery(tmp_path, redis_url):
    import sqlalchemy as sa

    with bench_on_postgres("promesa_bench_long_poll", ["--long-poll", "30", "--events", "20", "--history", "0"],
                           tmp_path, redis_url) as (result, stdout, database_url):
        assert result["complete"] is True
        assert (result["waiting"], result["refused"], result["published"], result["answered"], result["deliveries"],
                result["not_its_own"], result["handed_wrong"]) == (30, 0, 20, 20, 20, 0, 0)
        assert result["wake_ms"]["p50"] > 0 and result["rss_kb_per_waiting_pull"] is not None
        assert "pulls waiting on one web process" in stdout and "woken by their event" in stdout
        engine = sa.create_engine(database_url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM subscriptions")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM deliveries")).scalar() == 0
        engine.dispose()
