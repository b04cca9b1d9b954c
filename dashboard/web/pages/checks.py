"""The receiver check on the dashboard: the subscription page's report card and diagnosis (both
partials, fed by `receiver_check(sub)`), the "Run receiver check" button, and the card's own route,
which the card polls while its check runs. Running a check is a repair action: `access.can_operate`."""

from __future__ import annotations

from flask import current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from dashboard.accounts import access
from dashboard.models import Check
from dashboard.subscriptions import checks as check_service
from dashboard.subscriptions import diagnosis
from dashboard.web.pages import both, bp


@bp.app_context_processor
def _receiver_check():
    return {"receiver_check": card, "receiver_diagnosis": failures}


def card(sub, check: Check | None = None) -> dict:
    """What the report card shows: the latest check (or the given one), its counts, who may run one."""
    check = check or check_service.latest(sub.id)
    return {"check": check, "summary": check_service.summary(check),
            "can_run": access.can_operate(current_user, sub) and sub.deleted_at is None,
            "scheme": sub.signature_scheme}


def failures(sub) -> diagnosis.Diagnosis:
    return diagnosis.diagnose(sub, current_app.config["CLOCK"].now())


@both("/subscriptions/<subscription_id>/checks", methods=["POST"])
@login_required
def run_check(subscription_id):
    # Forged, stale and tampered requests may page a receiver's team: run only when asked, at most once a minute.
    sub = access.visible_subscription(subscription_id, need=access.can_operate)
    try:
        check = check_service.start(sub)
    except check_service.TooSoon as refused:  # the page, saying why and when: 429 and Retry-After, as on the API
        flash(refused.message, "error")
        page = current_app.view_functions[f"{request.blueprint}.subscription"](subscription_id=sub.id)
        return page, 429, {"Retry-After": str(refused.retry_after)}
    flash(f"Receiver check {check.id} started: the report appears below when it finishes.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id, _anchor="receiver-check"))


@both("/subscriptions/<subscription_id>/checks/<check_id>", methods=["GET"])
@login_required
def check_card(subscription_id, check_id):
    """The report card alone; while its check runs, it asks again every second."""
    sub = access.visible_subscription(subscription_id)
    return render_template("subscriptions/_check.html", sub=sub,
                           rc=card(sub, access.of_subscription(Check, check_id, sub)))
