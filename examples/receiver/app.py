"""An example receiver of Promesa webhooks, small enough to copy.

One route, ``POST /webhooks/promesa``, does five things and nothing else:

1. reads the body as raw bytes (``request.get_data()``), before anything parses it;
2. verifies the signature over those bytes with the configured secret(s): a forged,
   tampered or stale request is answered 400 with a short reason, and nothing is stored;
3. records the event in the inbox with one INSERT on its id (the claim), committed
   before answering; a duplicate is recognised by that same INSERT;
4. enqueues the work as an RQ job that takes only the event id (``jobs.process_event``);
5. answers 200 at once, duplicates included (a 4xx/5xx would make Promesa send it again).

Configuration (``create_app(config)`` keys, or the same names in the environment):

  PROMESA_WEBHOOK_SECRETS      the subscription's signing secret(s); several (comma-separated
                               in the environment) while a secret is being rotated. Required.
  PROMESA_SIGNATURE_SCHEME     "promesa" (X-Signature, the default) or "standard-webhooks"
  PROMESA_SIGNATURE_TOLERANCE  seconds a signature's timestamp may differ from now (300)
  RECEIVER_DATABASE_URL        SQLAlchemy URL of the receiver's own database
                               (default sqlite:///promesa-receiver.db)
  RECEIVER_REDIS_URL           Redis for the job queue (default redis://127.0.0.1:6379/0)
  RECEIVER_QUEUE               RQ queue name (default promesa-receiver)
  RECEIVER_CLOCK               create_app only: a callable returning unix seconds (tests)

Run: ``flask --app examples.receiver.app run --port 8000`` (or gunicorn
``'examples.receiver.app:create_app()'``) and ``flask --app examples.receiver.app worker``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import click
import redis
from flask import Blueprint, Flask, current_app, jsonify, request
from rq import Queue, Retry, SimpleWorker

from promesa_receiver import (
    PROMESA_HEADER,
    InvalidEvent,
    VerificationError,
    parse_event,
    verify,
    verify_standard,
)

from .jobs import process_event
from .storage import Receipt, Storage

DEFAULTS = {
    "PROMESA_WEBHOOK_SECRETS": [],
    "PROMESA_SIGNATURE_SCHEME": "promesa",
    "PROMESA_SIGNATURE_TOLERANCE": 300,
    "RECEIVER_DATABASE_URL": "sqlite:///promesa-receiver.db",
    "RECEIVER_REDIS_URL": "redis://127.0.0.1:6379/0",
    "RECEIVER_QUEUE": "promesa-receiver",
    "RECEIVER_CLOCK": time.time,
    # Promesa's events are thin (ids and versions): anything big is not one of them.
    "MAX_CONTENT_LENGTH": 256 * 1024,
}
SCHEMES = ("promesa", "standard-webhooks")

bp = Blueprint("promesa_webhooks", __name__)


@dataclass
class Receiver:
    """What the route and the jobs share: ``app.extensions["promesa_receiver"]``."""

    storage: Storage
    redis: redis.Redis
    queue: Queue

    def enqueue(self, event_id: str) -> None:
        self.queue.enqueue(process_event, event_id, description=f"process Promesa event {event_id}",
                           job_timeout=60, result_ttl=0, failure_ttl=7 * 86400,
                           retry=Retry(max=3, interval=[10, 60, 300]))


def create_app(config: dict | None = None) -> Flask:
    app = Flask(__name__, static_folder=None)
    app.config.update(DEFAULTS)
    app.config.update(_from_environment())
    app.config.update(config or {})
    secrets = app.config["PROMESA_WEBHOOK_SECRETS"]
    if isinstance(secrets, str):
        secrets = app.config["PROMESA_WEBHOOK_SECRETS"] = [s.strip() for s in secrets.split(",") if s.strip()]
    if not secrets:
        raise RuntimeError("set PROMESA_WEBHOOK_SECRETS to the subscription's signing secret (whsec_...)")
    if app.config["PROMESA_SIGNATURE_SCHEME"] not in SCHEMES:
        raise RuntimeError(f"PROMESA_SIGNATURE_SCHEME must be one of: {', '.join(SCHEMES)}")

    storage = Storage(app.config["RECEIVER_DATABASE_URL"], app.config["RECEIVER_CLOCK"])
    storage.create_tables()
    conn = redis.Redis.from_url(app.config["RECEIVER_REDIS_URL"])
    app.extensions["promesa_receiver"] = Receiver(storage, conn, Queue(app.config["RECEIVER_QUEUE"], connection=conn))
    app.register_blueprint(bp)
    app.cli.add_command(worker)
    app.cli.add_command(requeue)
    return app


def _from_environment() -> dict:
    env = {k: os.environ[k] for k in DEFAULTS if k in os.environ and k != "RECEIVER_CLOCK"}
    if "PROMESA_SIGNATURE_TOLERANCE" in env:
        env["PROMESA_SIGNATURE_TOLERANCE"] = int(env["PROMESA_SIGNATURE_TOLERANCE"])
    if "MAX_CONTENT_LENGTH" in env:
        env["MAX_CONTENT_LENGTH"] = int(env["MAX_CONTENT_LENGTH"])
    return env


@bp.post("/webhooks/promesa")
def promesa_webhook():
    cfg = current_app.config
    receiver: Receiver = current_app.extensions["promesa_receiver"]

    # 1. The bytes exactly as they came: parsing and re-serialising JSON changes them.
    raw = request.get_data()

    # 2. Authenticity and freshness, before anything is believed or stored.
    try:
        now = cfg["RECEIVER_CLOCK"]()
        tolerance = cfg["PROMESA_SIGNATURE_TOLERANCE"]
        if cfg["PROMESA_SIGNATURE_SCHEME"] == "standard-webhooks":
            signed_at = verify_standard(raw, request.headers, cfg["PROMESA_WEBHOOK_SECRETS"], tolerance, now=now)
        else:
            signed_at = verify(raw, request.headers.get(PROMESA_HEADER), cfg["PROMESA_WEBHOOK_SECRETS"],
                               tolerance, now=now)
        event = parse_event(raw)
    except VerificationError as exc:
        current_app.logger.warning("rejected a webhook: %s", exc)
        return jsonify(error=f"signature rejected: {exc}"), 400
    except InvalidEvent as exc:
        return jsonify(error=f"not a Promesa event: {exc}"), 400

    # 3. Persist before answering: one atomic INSERT on the event id (the claim). A database
    #    error here is a 500 on purpose: nothing was stored, so Promesa must retry.
    receipt = receiver.storage.record(event, raw, signed_at)

    # 4. The work goes to a job. A duplicate whose job has not finished is enqueued again: that
    #    heals a lost enqueue (see below), and a second job for one event id does nothing.
    if receipt is not Receipt.DUPLICATE_DONE:
        try:
            receiver.enqueue(event.event_id)
        except (redis.RedisError, OSError):
            current_app.logger.exception("stored event %s but could not enqueue its job", event.event_id)
            # Stored, but no job: say so, and Promesa's retry (a duplicate) enqueues it again.
            return jsonify(error="stored, but the job queue is unavailable; retry later"), 503

    # 5. Answer at once, duplicates too.
    return jsonify(status="accepted" if receipt is Receipt.NEW else "duplicate", event_id=event.event_id), 200


@click.command()
@click.option("--burst", is_flag=True, help="run the queued jobs, then exit")
def worker(burst):
    """Run the receiver's RQ jobs (as many workers as you like)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    receiver: Receiver = current_app.extensions["promesa_receiver"]
    SimpleWorker([receiver.queue], connection=receiver.redis).work(burst=burst, with_scheduler=True)


@click.command()
def requeue():
    """Enqueue a job for every stored event not processed yet (after Redis lost its queue)."""
    receiver: Receiver = current_app.extensions["promesa_receiver"]
    ids = receiver.storage.unprocessed_ids()
    for event_id in ids:
        receiver.enqueue(event_id)
    click.echo(f"re-enqueued {len(ids)} event(s)")
