"""A secret shown once, on the page a form redirects to (post/redirect/get: reloading that page never
sends the form again, so it never creates a second subscription, token, sink or user).

The session is a cookie that is signed, not encrypted: whoever holds it reads it, and an old copy can be
sent again. So the secret never goes into it. It waits on the server, in Redis, encrypted like every
secret at rest (dashboard.core.crypto), for a few minutes, under a random name that only this session
knows; the first page that shows it deletes it, so a reload or an old cookie finds nothing.
"""

from __future__ import annotations

import json
import secrets

import redis
from flask import current_app, redirect, session

from dashboard.core import crypto
from dashboard.queue.work import connect

KEPT_SECONDS = 300  # long enough to follow a redirect on a slow phone; short enough to be gone soon after
SESSION_KEY = "shown_once"


def _redis_key(name: str) -> str:
    return f"{current_app.config['PROMESA_REDIS_PREFIX']}:shown-once:{name}"


def show_after_redirect(kind: str, about: str, secret: str, to: str, show_here):
    """A 303 to `to`, whose page takes the secret with `take(kind, about)`. When Redis is away the secret
    cannot wait: `show_here()` shows it in this answer (never cached) rather than lose it."""
    name = secrets.token_urlsafe(24)
    try:
        connect().set(_redis_key(name), crypto.encrypt(secret), ex=KEPT_SECONDS)
    except (redis.RedisError, OSError):
        response = current_app.make_response(show_here())
        response.headers["Cache-Control"] = "no-store"
        return response
    session[SESSION_KEY] = json.dumps([kind, str(about), name])
    return redirect(to, 303)


def take(kind: str, about: str | None = None) -> tuple[str, str] | None:
    """(what it is about, the secret) when this session has a secret waiting for this kind of page (and
    this object, if given), once: it is deleted as it is read. None otherwise, and after a Redis outage."""
    waiting = session.get(SESSION_KEY)
    if not waiting:
        return None
    waiting_kind, waiting_about, name = json.loads(waiting)
    if waiting_kind != kind or (about is not None and waiting_about != str(about)):
        return None
    session.pop(SESSION_KEY)
    try:
        with connect().pipeline(transaction=True) as pipe:  # read and delete in one step: two tabs get one copy
            ciphertext, _ = pipe.get(_redis_key(name)).delete(_redis_key(name)).execute()
    except (redis.RedisError, OSError):
        return None
    if ciphertext is None:
        return None
    return waiting_about, crypto.decrypt(ciphertext.decode("ascii") if isinstance(ciphertext, bytes) else ciphertext)
