"""A bench run on PostgreSQL for the bench's smoke tests: a fresh migrated database, the CLI in a process of its
own, its JSON line read back."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def bench_on_postgres(prefix: str, args: list[str], tmp_path, redis_url: str):
    """Run `promesa bench <args> --json` on a database of its own; yield (its JSON result, its stdout, the
    database's URL) while that database still exists, for the test to look at what the run left."""
    from tests.conftest import _migrate, fresh_postgres_database

    with fresh_postgres_database(prefix) as database_url:
        _migrate(database_url)
        env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, PROMESA_INSTANCE_PATH=str(tmp_path))
        done = subprocess.run([sys.executable, "-m", "dashboard.cli", "bench", *args, "--json"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        yield json.loads(done.stdout.strip().splitlines()[-1]), done.stdout, database_url
