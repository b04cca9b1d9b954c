"""gunicorn's threaded worker with a parking lot: long-polled pulls wait without a thread each.

A view asks to park a request (dashboard.web.long_poll). The worker then sends nothing, hands the thread
back to its pool, and keeps the connection in its selector loop: a parked request costs a socket and a few
objects, not a thread. The request is run again, on a thread of the pool, when its subscription is announced
on Redis (`pull_due_channel`: a push left deliveries of it due), when it is due by time, or at its deadline.
While Redis is away it is looked at every second instead. A worker that stops runs every parked request
again as final first. Bounds: PROMESA_PULL_WAITS_PER_PROCESS in all and PROMESA_PULL_WAITS_PER_TEAM for each
team; a request over either is run again at once, refused (503, 429).
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass

import redis
from gunicorn.workers.gthread import ThreadWorker

from dashboard.core.outages import REDIS_AWAY
from dashboard.queue.work import connect, pull_due_channel, separate_client
from dashboard.web import long_poll

log = logging.getLogger(__name__)

# Without Redis's announcements, parked requests look again this often.
UNANNOUNCED_LOOK_SECONDS = 1.0
_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN)


class Parked(Exception):
    """Raised through gunicorn's request handling instead of a response: the request waits, unanswered."""

    def __init__(self, park: long_poll.Park):
        super().__init__(park.key)
        self.park = park
        self.req = None


@dataclass
class _Spot:
    req: object
    park: long_poll.Park
    watched: bool  # its socket is in the selector (a closed client is noticed)


class ParkingWorker(ThreadWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.desk = long_poll.Desk()
        self.flask_app = None
        self._spots: dict[object, _Spot] = {}  # connection -> its parked request (touched on the main thread only)
        self._by_key: dict[str, set] = {}
        self._by_team: dict[str, int] = {}
        self._timers: list[tuple[float, int, object]] = []  # (wake at, tie-break, connection), stale ones skipped
        self._tie = itertools.count()
        self._local = threading.local()
        self.listening = False  # Redis's announcements are arriving

    # -- the app, and the announcements it is woken by ------------------------------------------------
    def load_wsgi(self):
        super().load_wsgi()
        self.flask_app = app = self.wsgi
        config = app.config
        self.waits_per_process = config["PROMESA_PULL_WAITS_PER_PROCESS"]
        self.waits_per_team = config["PROMESA_PULL_WAITS_PER_TEAM"]
        self.wsgi = self._parking_app
        threading.Thread(target=self._listen, name="promesa-pull-announcements", daemon=True).start()

    def _parking_app(self, environ, start_response):
        environ[long_poll.DESK] = self.desk
        environ[long_poll.WAITING] = getattr(self._local, "waiting", None)
        body = self.flask_app(environ, start_response)
        park = environ.get(long_poll.PARKED)
        if park is None:
            return body
        if hasattr(body, "close"):
            body.close()
        raise Parked(park)

    def _listen(self) -> None:
        """Count each announcement of a subscription and wake what waits for it; reconnect while Redis is away
        (a line when that starts and one when it ends, never one per try)."""
        app = self.flask_app
        channel = pull_due_channel(app.config["PROMESA_REDIS_PREFIX"])
        pause = 0.5
        while self.alive:
            try:
                pubsub = separate_client(connect(app)).pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(channel)
                if pause > 0.5:
                    log.warning("pull announcements are back: waiting pulls wake on their deliveries again")
                pause = 0.5
                while self.alive:
                    self.listening = True
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        keys = message["data"].decode().split()
                        announced = self.desk.announced
                        for key in keys:
                            announced[key] = announced.get(key, 0) + 1
                        self.method_queue.defer(self._announce, keys)
            except (*REDIS_AWAY, redis.exceptions.RedisError) as exc:
                self.listening = False
                if pause == 0.5:
                    log.warning("pull announcements stopped, Redis is away (%s): waiting pulls look every %.0f s "
                                "meanwhile", exc.__class__.__name__, UNANNOUNCED_LOOK_SECONDS)
                time.sleep(pause)
                pause = min(pause * 2, 10.0)

    # -- gunicorn's request handling, with a way out for a parked request ------------------------------
    def handle_request(self, req, conn):
        try:
            return super().handle_request(req, conn)
        except Parked as parked:
            parked.req = req
            return parked

    def _keepalive_after(self, conn, keepalive):
        if isinstance(keepalive, Parked):
            return keepalive
        return super()._keepalive_after(conn, keepalive)

    def finish_request(self, conn, fs):
        parked = None if fs.cancelled() or fs.exception() is not None else fs.result()
        if isinstance(parked, Parked):
            self._park(conn, parked.req, parked.park)
        else:
            super().finish_request(conn, fs)

    def _run_again(self, conn, req, waiting: long_poll.Waiting):
        """A parked request, run again on a thread of the pool (as gunicorn's `handle` runs a new one)."""
        conn.sock.setblocking(True)
        self._local.waiting = waiting
        try:
            return self._keepalive_after(conn, self.handle_request(req, conn))
        except OSError as exc:
            if exc.errno not in _GONE:
                self.log.exception("Socket error answering a parked request.")
        except Exception as exc:
            self.handle_error(req, conn.sock, conn.client, exc)
        finally:
            self._local.waiting = None
        return False

    # -- the lot (main thread) ------------------------------------------------------------------------
    def _park(self, conn, req, park: long_poll.Park) -> None:
        refused = None
        if len(self._spots) >= self.waits_per_process:
            refused = (503, f"this server process already keeps {self.waits_per_process} pulls waiting: pull again, or "
                            "without wait", {})
        elif self._by_team.get(park.team, 0) >= self.waits_per_team:
            refused = (429, f"your team already has {self.waits_per_team} pulls waiting on this server process: "
                            "pull again when one has answered",
                       {"quota": "pull_waits_per_team", "limit": self.waits_per_team, "retry_after_seconds": 1})
        if refused or not self.alive or self.desk.seen(park.key) != park.seen:
            self._submit(conn, req, long_poll.Waiting(park.deadline, final=not self.alive, refused=refused))
            return
        watched = not hasattr(conn.sock, "pending")  # a TLS socket cannot be peeked at: its close shows at the wake
        conn.sock.setblocking(False)
        if watched:
            self.poller.register(conn.sock, selectors.EVENT_READ, lambda _sock: self._readable(conn))
        self._spots[conn] = _Spot(req, park, watched)
        self._by_key.setdefault(park.key, set()).add(conn)
        self._by_team[park.team] = self._by_team.get(park.team, 0) + 1
        wake_at = park.wake_at if self.listening else min(park.wake_at, time.monotonic() + UNANNOUNCED_LOOK_SECONDS)
        heapq.heappush(self._timers, (wake_at, next(self._tie), conn))

    def _leave(self, conn) -> _Spot | None:
        spot = self._spots.pop(conn, None)
        if spot is None:
            return None
        if spot.watched:
            try:
                self.poller.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        waiting = self._by_key[spot.park.key]
        waiting.discard(conn)
        if not waiting:
            del self._by_key[spot.park.key]
        self._by_team[spot.park.team] -= 1
        if not self._by_team[spot.park.team]:
            del self._by_team[spot.park.team]
        return spot

    def _wake(self, conn, final: bool = False) -> None:
        spot = self._leave(conn)
        if spot is not None:
            final = final or not self.alive or time.monotonic() >= spot.park.deadline
            self._submit(conn, spot.req, long_poll.Waiting(spot.park.deadline, final=final))

    def _submit(self, conn, req, waiting: long_poll.Waiting) -> None:
        fs = self.tpool.submit(self._run_again, conn, req, waiting)
        fs.add_done_callback(lambda fut: self.method_queue.defer(self.finish_request, conn, fut))

    def _announce(self, keys: list[str]) -> None:
        for key in keys:
            for conn in list(self._by_key.get(key, ())):
                self._wake(conn)

    def _readable(self, conn) -> None:
        """A parked client sent something: its close (forget it), or its next request (answer this one now)."""
        try:
            closed = conn.sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return
        except OSError:
            closed = True
        if not closed:
            self._wake(conn)
            return
        self._leave(conn)
        self.nr_conns -= 1
        conn.close()

    def _wake_due(self) -> None:
        now = time.monotonic()
        stopping = not self.alive
        while self._timers and (stopping or self._timers[0][0] <= now):
            _, _, conn = heapq.heappop(self._timers)
            spot = self._spots.get(conn)
            if spot is None:
                continue  # answered or gone since
            if stopping or spot.park.wake_at <= now or not self.listening:
                self._wake(conn)
            else:  # an early look while Redis was away; it is back, so the request waits for its own time
                heapq.heappush(self._timers, (spot.park.wake_at, next(self._tie), conn))

    def wait_for_and_dispatch_events(self, timeout):
        if self._timers:
            timeout = max(0.0, min(timeout, self._timers[0][0] - time.monotonic()))
        super().wait_for_and_dispatch_events(timeout)
        self._wake_due()
