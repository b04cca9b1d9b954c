"""`promesa bench --filters` on PostgreSQL (ingest's own path and its kept routing), tiny: a smoke test, not a
timing test. Both kinds of phase ran, every admitted event got a delivery per endpoint, the events the filter
refuses got none, and the run's rows are gone after."""

from __future__ import annotations

import pytest

from tests.support.bench_runs import bench_on_postgres


@pytest.mark.slow
@pytest.mark.postgres
def test_the_filters_run_compares_filtered_with_unfiltered_ingest_and_counts_every_delivery(tmp_path, redis_url):
    import sqlalchemy as sa

    with bench_on_postgres("promesa_bench_filters", ["--filters", "--events", "30", "--rounds", "2",
                                                     "--subscriptions", "2", "--workers", "1"],
                           tmp_path, redis_url) as (result, _, database_url):
        assert result["complete"] is True and result["publish_errors"] == 0
        assert result["admitted"] == {"events": 120, "deliveries": 240, "expected_deliveries": 240}
        assert result["refused"] == {"events": 50, "deliveries": 0}
        assert len(result["round_ratios"]) == 2 and result["ratio"] > 0
        assert sum(1 for _ in result["filter"]) == 5
        engine = sa.create_engine(database_url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM subscriptions")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM teams")).scalar() == 0
        engine.dispose()
