"""The receiver check and the diagnosis over the API: start a check (a job, answered at once), read
its report, and read the subscription's recent failures grouped by cause."""

from __future__ import annotations

from flask import current_app, g, jsonify

from dashboard import schemas
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError
from dashboard.models import Check, Subscription
from dashboard.subscriptions import checks as check_service
from dashboard.subscriptions import diagnosis
from dashboard.subscriptions import service as subscription_service
from dashboard.web.api import bp, shapes
from dashboard.web.api.operations import operation


@bp.post("/subscriptions/<subscription_id>/checks")
@operation("Run the receiver check: five real signed deliveries of the reserved type promesa.check (each with "
           "X-Promesa-Check: <check id>), judged against the receiver contract. Kept apart from deliveries: no "
           "count, chart, incident or dead letter sees them. One at a time and at most one a minute per team, whichever "
           "subscription",
           responses={202: schemas.CheckStarted}, errors=(409, 429), links_to="check_id")
def start_check(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    check = check_service.start(sub)
    return jsonify(id=check.id), 202


@bp.get("/checks/<check_id>")
@operation("A receiver check's report: one result per rule once finished", responses={200: schemas.Check})
def get_check(check_id):
    check = db.session.get(Check, check_id)
    sub = db.session.get(Subscription, check.subscription_id) if check is not None else None
    if sub is None or sub.team_id != g.team.id:
        raise ApiError(404, f"no check {check_id!r} in your team")
    return jsonify(shapes.check(check))


@bp.get("/subscriptions/<subscription_id>/diagnosis")
@operation("The subscription's failed attempts of the last 24 h grouped by cause, each with advice (read from "
           "the stored attempts: nothing is sent)", responses={200: schemas.Diagnosis})
def get_diagnosis(subscription_id):
    sub = subscription_service.team_subscription(g.team, subscription_id)
    return jsonify(diagnosis.as_json(sub, diagnosis.diagnose(sub, current_app.config["CLOCK"].now())))
