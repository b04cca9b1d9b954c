"""A delivery's page: the request as sent, every attempt, and what happens next."""

from __future__ import annotations

import re

from flask import abort, current_app, render_template
from flask_login import current_user, login_required
from promesa_receiver import signing

from dashboard.accounts import access
from dashboard.core import crypto
from dashboard.core.clock import unix
from dashboard.core.extensions import db
from dashboard.delivery.http import delivery_headers
from dashboard.models import Delivery
from dashboard.subscriptions import client_auth, own_headers
from dashboard.web.pages import both

SIGNATURE_HEADERS = (signing.PROMESA_HEADER, "webhook-signature")
# A signature's value keeps its first characters: enough to compare with what a receiver logged, never enough to forge.
_SIGNATURE_VALUE = re.compile(r"(v1[=,])([0-9A-Za-z+/]{6})[0-9A-Za-z+/=]+")


def shorten_signatures(headers: dict[str, str]) -> dict[str, str]:
    return {name: _SIGNATURE_VALUE.sub(r"\1\2…", value) if name in SIGNATURE_HEADERS else value
            for name, value in headers.items()}


def request_as_sent(d: Delivery) -> tuple[int, dict[str, str]]:
    """(attempt number, headers) of the latest attempt, or of the first one to come, rebuilt the way the
    worker builds them, with signatures shortened and the receiver's own header values masked."""
    latest = d.attempts[-1] if d.attempts else None
    number = latest.number if latest else d.attempt_count + 1
    when = latest.attempted_at if latest else current_app.config["CLOCK"].now()
    headers = delivery_headers(event_id=d.event.id, event_type=d.event.type, delivery_id=d.id, attempt_number=number,
                               scheme=d.subscription.signature_scheme,
                               secrets=[crypto.decrypt(d.subscription.secret_ciphertext)],
                               timestamp=int(unix(when)), body=d.event.body.encode("utf-8"),
                               traceparent=d.event.traceparent,
                               own=own_headers.masked_of(d.subscription)  # names only: values are credentials
                               | client_auth.masked_header(d.subscription))
    return number, shorten_signatures(headers)


@both("/deliveries/<delivery_id>", methods=["GET"])
@login_required
def delivery(delivery_id):
    d = db.session.get(Delivery, delivery_id)
    if d is None or not access.can_view(current_user, d.subscription):
        abort(404)
    number, headers = request_as_sent(d)
    return render_template("deliveries/page.html", d=d, sub=d.subscription, headers=headers, headers_for=number,
                           can_operate=access.can_operate(current_user, d.subscription)
                           and d.subscription.deleted_at is None)
