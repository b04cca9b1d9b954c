"""The ingest baseline `promesa bench` measures Promesa's API against: the least a Flask view
can do for one event, served the same way (gunicorn, `dashboard.web.server` settings, the same
number of processes) against the same database: parse the JSON body, insert one row, commit,
answer 202 with an id. No token, no routing, no deliveries, no Redis.

gunicorn loads `promesa_bench.baseline:create_app()`; the table is named by
PROMESA_BENCH_BASELINE_TABLE and made (and dropped) by the bench.
"""

from __future__ import annotations

import os
import uuid

from flask import Flask, abort, jsonify, request
from sqlalchemy import Column, MetaData, String, Table, Text, create_engine, insert

from dashboard.core.config import normalize_database_url


def baseline_table(name: str, metadata: MetaData | None = None) -> Table:
    return Table(name, metadata or MetaData(), Column("id", String(40), primary_key=True),
                 Column("type", String(200)), Column("body", Text))


def create_app() -> Flask:
    app = Flask(__name__)
    engine = create_engine(normalize_database_url(os.environ["DATABASE_URL"]))
    statement = insert(baseline_table(os.environ["PROMESA_BENCH_BASELINE_TABLE"]))

    @app.post("/api/v1/events")
    def accept():
        payload = request.get_json(silent=True)
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            abort(400)
        event_id = uuid.uuid4().hex
        with engine.begin() as conn:
            conn.execute(statement, {"id": event_id, "type": payload["type"], "body": request.get_data(as_text=True)})
        return jsonify(id=event_id), 202

    @app.get("/ready")
    def ready():
        return "ok"

    return app
