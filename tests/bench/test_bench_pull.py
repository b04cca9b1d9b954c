"""`promesa bench --pull` on PostgreSQL, tiny: a smoke test, not a timing test. Both kinds of phase ran in
each round, every delivery of both subscriptions was settled with exactly one attempt, none was handed out
or received twice, both figures and their ratio are reported, and the run's rows are gone after."""

from __future__ import annotations

import pytest

from tests.support.bench_runs import bench_on_postgres


@pytest.mark.slow
@pytest.mark.postgres
def test_the_pull_run_settles_every_delivery_once_and_reports_pull_beside_push(tmp_path, redis_url):
    import sqlalchemy as sa

    with bench_on_postgres("promesa_bench_pull", ["--pull", "--events", "150", "--rounds", "2", "--workers", "1"],
                           tmp_path, redis_url) as (result, stdout, database_url):
        assert result["complete"] is True and result["publish_errors"] == 0
        # 150 a round and 100 at most a pull: each round's pullers pull and ack more than once.
        assert result["pull"] == {"expected": 300, "deliveries": 300, "settled": 300, "attempts": 300,
                                  "not_attempted_once": 0, "handed_twice": 0, "unread": 0, "refused": 0}
        assert result["push"] == {"expected": 300, "deliveries": 300, "settled": 300, "attempts": 300,
                                  "not_attempted_once": 0, "received_twice": 0}
        assert len(result["rates"]["pull"]) == len(result["rates"]["push"]) == 2
        assert result["medians"]["pull"] > 0 and result["medians"]["push"] > 0 and result["ratio"] > 0
        assert all(pulls >= 2 for pulls in result["pull_requests"]["pulls"])
        assert "pull against push" in stdout and "target for pull" in stdout
        engine = sa.create_engine(database_url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM subscriptions")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM deliveries")).scalar() == 0
            assert conn.execute(sa.text("SELECT count(*) FROM teams")).scalar() == 0
        engine.dispose()
