"""`promesa bench --filters` on PostgreSQL (ingest's own path and its kept routing), tiny: a smoke test, not a
timing test. Both kinds of phase ran, every admitted event got a delivery per endpoint, the events the filter
refuses got none, and the run's rows are gone after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.postgres
def test_the_filters_run_compares_filtered_with_unfiltered_ingest_and_counts_every_delivery(tmp_path, redis_url):
    import sqlalchemy as sa

    from tests.conftest import _migrate, fresh_postgres_database

    with fresh_postgres_database("promesa_bench_filters") as database_url:
        _migrate(database_url)
        env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, PROMESA_INSTANCE_PATH=str(tmp_path))
        done = subprocess.run(
            [sys.executable, "-m", "dashboard.cli", "bench", "--filters", "--events", "30", "--rounds", "2",
             "--subscriptions", "2", "--workers", "1", "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
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
