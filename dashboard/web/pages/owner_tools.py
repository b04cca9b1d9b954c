"""What a team's owners (and admins) do to a subscription: edit it, rotate its secret, end a rotation's
grace, send it a test event, delete it. Operators repair (pause, resume, replay) but do not redefine:
every route here asks `access.can_edit`.

In the consumer portal the same views serve the consumer's own endpoints (`pages.both`), and `new_endpoint` is
the dashboard's new subscription for the session's consumer. A consumer sets all an owner does but
DASHBOARD_ONLY_FIELDS (and never a quota), and on a strict team picks catalog types only.

A new subscription is pushed to a URL or pulled by its receiver (the form's `mode`); a pull subscription's forms
leave out what only a push has (dashboard.delivery.pull.PUSH_ONLY), and the service refuses it when filled in.

The subscription page includes `owner_tools/_panel.html`; its data comes from `owner_tools(sub)`.
"""

from __future__ import annotations

import fnmatch
import functools
import json

from flask import (
    abort,
    current_app,
    flash,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_login import current_user, login_required
from pydantic import ValidationError
from sqlalchemy import select

from dashboard import schemas
from dashboard.accounts import access
from dashboard.core import filters
from dashboard.core.extensions import db
from dashboard.core.links import absolute_for
from dashboard.core.validation import ApiError, explain
from dashboard.delivery.policies import POLICY_NAMES
from dashboard.delivery.pull import PUSH_ONLY
from dashboard.ingest import catalog
from dashboard.ingest.quotas import QuotaExceeded
from dashboard.models import Consumer, Delivery, SubscriptionMode, Team
from dashboard.operations import notifications
from dashboard.subscriptions import client_auth, client_tls, contract, examples, own_headers, pull_keys, rotation
from dashboard.subscriptions import service as subscription_service
from dashboard.web.pages import both, bp, portal_bp, shown_once
from dashboard.web.pages.subscriptions import deliveries

DEFAULT_MAX_AGE_SECONDS = schemas.SubscriptionInput.model_fields["max_age_seconds"].default
# A push's timeouts left empty on its form: the API's defaults.
DEFAULT_TIMEOUTS = {name: schemas.SubscriptionInput.model_fields[name].default
                    for name in ("connect_timeout", "attempt_timeout")}
# What the dashboard sets and a consumer does not: requests in flight share the team's workers.
DASHBOARD_ONLY_FIELDS = ("max_in_flight",)
GRACE_CHOICES = [(0, "none: the old secret stops at once"), (3600, "1 hour"), (86400, "24 hours"),
                 (3 * 86400, "3 days"), (7 * 86400, "7 days")]


@bp.app_context_processor
def _owner_tools():
    return {"owner_tools": panel, "own_header_names": own_headers.names, "max_own_headers": own_headers.MAX_HEADERS,
            "client_auth_of": client_auth.masked_of}


def panel(sub) -> dict:
    """What the owner tools panel shows: who may use it, and which secrets sign until when (never values)."""
    now = current_app.config["CLOCK"].now()
    return {"can_edit": access.can_edit(current_user, sub) and sub.deleted_at is None,
            "signing": rotation.signing_secrets(sub, now), "grace_choices": GRACE_CHOICES,
            "default_grace": rotation.DEFAULT_GRACE_SECONDS,
            "in_flight_default": current_app.config["PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION"]}


def owner_action(view):
    """The view gets the subscription if the user may edit it (404/403 otherwise) and it is not deleted."""
    @functools.wraps(view)
    def wrapped(subscription_id):
        sub = access.visible_subscription(subscription_id, need=access.can_edit)
        if sub.deleted_at is not None:
            flash("This subscription is deleted: its history stays readable, nothing else changes.", "error")
            return redirect(url_for(".subscription", subscription_id=sub.id))
        return view(sub)
    return wrapped


def _number_or_none(form, name, kind):
    raw = form.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be a {'whole ' if kind is int else ''}number, or empty") from None


def event_types_from_form(form) -> list[str]:
    """The ticked catalog types and the patterns typed beside them (comma- or space-separated), in order, once each."""
    chosen = []
    for raw in [*form.getlist("event_types"), form.get("event_patterns", "")]:
        for name in raw.replace(",", " ").split():
            if name not in chosen:
                chosen.append(name)
    return chosen


def filter_from_form(form) -> dict | None:
    """The filter box as the API's `filter`: JSON text (empty: none). Its language is checked by the API's model."""
    text = form.get("filter", "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ApiError(400, f"the filter is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None


def limits_from_form(form, mode: str) -> dict:
    """What creation and edit share: description, types, versions, retry policy, timeouts and limits. A push's
    timeouts left empty are the defaults; a pull subscription's are None, as its other empty push settings."""
    event_types = event_types_from_form(form)
    if not event_types:  # the API's default ("*") is never chosen for someone who ticked nothing
        raise ApiError(400, "choose the event types: tick “All event types”, or some types, or type a pattern")
    payload = {
        "description": form.get("description", ""),
        "event_types": event_types,
        "retry_policy": form.get("retry_policy", ""),
        "rate_limit_per_s": _number_or_none(form, "rate_limit_per_s", float),
        "max_in_flight": _number_or_none(form, "max_in_flight", int),
    }
    versions = {}
    for pair in filter(None, (p.strip() for p in form.get("event_versions", "").split(","))):
        name, _, version = pair.partition("=")
        if not version.strip().isdigit():
            raise ApiError(400, "event versions are written type=version, like file.updated=2")
        versions[name.strip()] = int(version)
    payload["event_versions"] = versions
    for name, default in DEFAULT_TIMEOUTS.items():
        value = _number_or_none(form, name, float)
        payload[name] = default if value is None and mode != SubscriptionMode.PULL else value
    payload["max_age_seconds"] = _number_or_none(form, "max_age_seconds", int)
    if payload["max_age_seconds"] is None:
        raise ApiError(400, "max_age_seconds is required")
    if in_portal():  # not on its form: left as it is (an edit) or the default (a creation)
        for name in DASHBOARD_ONLY_FIELDS:
            payload.pop(name)
    return payload


def for_mode(payload: dict, mode: str) -> dict:
    """The form's payload as a subscription of this mode is given it: for pull, push's settings left empty are not
    given at all, and one filled in stays, for the service to refuse in the API's words (PUSH_ONLY)."""
    if mode != SubscriptionMode.PULL:
        return payload
    return {name: value for name, value in payload.items() if name not in PUSH_ONLY or value not in (None, "", {})}


def headers_from_form(form, saved: list[str]) -> dict[str, str | None]:
    """The header rows as the API's `headers`: a name with a value sets it; a saved name with its value box left
    empty keeps its value (on creation nothing is saved); a saved name no row names any more is removed (null).
    A form without the rows at all changes nothing."""
    headers: dict[str, str | None] = {}
    if "header_name" not in form:
        return headers
    for name, value in zip(form.getlist("header_name"), form.getlist("header_value")):
        name, value = name.strip(), value.strip()  # HTTP trims a value's ends anyway: a pasted newline is no error
        if not name:
            if value:
                raise ApiError(400, "a header value needs its name: fill in both, or clear both")
            continue
        if value:
            headers[name] = value
        elif name.lower() not in {kept.lower() for kept in saved}:  # names ignore case
            raise ApiError(400, f"give the header {name} a value")
    named = {name.strip().lower() for name in form.getlist("header_name")}
    return headers | {name: None for name in saved if name.lower() not in named}


def tls_from_form(form, sub=None) -> dict:
    """The client certificate boxes as the API's body takes them: {"tls": ...}, or {} to change nothing (no box
    filled). On an edit, a box left empty keeps what is saved (a renewed certificate may keep its key), and the
    remove box removes it (null)."""
    if form.get("tls_remove") == "on" and sub is not None:
        return {"tls": None}
    given = {part: form.get(box, "").strip() or None for part, box in (
        ("client_certificate", "tls_certificate"), ("client_key", "tls_key"), ("ca_certificates", "tls_ca"))}
    if not any(given.values()):
        return {}
    saved = (client_tls.stored(sub) if sub is not None else None) or {}
    setting = {part: value or saved.get(part) for part, value in given.items()}
    if not setting["client_certificate"] or not setting["client_key"]:
        raise ApiError(400, "a client certificate needs its certificate and its private key: give both, or neither")
    return {"tls": setting}


AUTH_FIELDS = ("token_url", "client_id", "client_secret", "scope", "audience")
# The boxes of the new subscription form that only a push fills: a pull form posted with one filled shows them.
PUSH_ONLY_BOXES = ("url", "connect_timeout", "attempt_timeout", "rate_limit_per_s", "max_in_flight", "header_name",
                   "header_value", *(f"auth_{name}" for name in AUTH_FIELDS), "tls_certificate", "tls_key", "tls_ca")


def push_settings_given(form) -> bool:
    """Is any box that only a push fills filled in (a URL typed before choosing pull)?"""
    return any(value.strip() for box in PUSH_ONLY_BOXES for value in form.getlist(box))


def auth_from_form(form):
    """The OAuth2 fieldset as the API's `auth`: None when its boxes are all empty (none, or removed on an edit),
    client_secret left out when its box is (an edit keeps the stored one); client_auth.UNCHANGED for a form
    without the fieldset."""
    if "auth_token_url" not in form:
        return client_auth.UNCHANGED
    given = {name: form.get(f"auth_{name}", "").strip() for name in AUTH_FIELDS}
    if not any(given.values()):
        return None
    return {"type": client_auth.TYPE, **{name: value or None for name, value in given.items()
                                         if value or name != "client_secret"}}


def in_portal() -> bool:
    """Is a consumer using these tools in its portal (not a user on the dashboard)?"""
    return access.is_portal(current_user)


def catalog_types_only(team: Team, event_types: list[str]) -> None:
    """A consumer of a strict team picks from its catalog: 422 for a type (or pattern) that names none of it."""
    if not team.strict_event_types:
        return
    names = catalog.team_event_type_names(team)
    for chosen in event_types:
        if chosen != "*" and not any(fnmatch.fnmatchcase(name, chosen) for name in names):
            raise ApiError(422, f"{chosen} is not in {team.name}'s catalog of event types, and {team.name} sends "
                                "declared types only: choose from the list")


def for_consumer(exc: ApiError) -> str:
    """A refusal in the words a consumer can act on: no quota, no server setting."""
    if isinstance(exc, QuotaExceeded):
        return "You have as many endpoints as you may: delete one to add another."
    return exc.message.split("; set PROMESA_", 1)[0]


def checked(model, payload: dict):
    """The payload as the API's body, checked by the API's own model: one set of rules."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ApiError(400, explain(model, exc)) from None


def edit_from_form(sub, form) -> schemas.SubscriptionEdit:
    """The form as the API's PATCH body, checked by the same model (schemas.SubscriptionEdit). A subscription
    keeps its mode: a pull subscription's form has none of push's boxes."""
    payload = limits_from_form(form, sub.mode)
    url = form.get("url", "").strip()
    if url != (sub.url or ""):  # checked (and resolved) only when it changes
        payload["url"] = url
    if in_portal() and payload["event_types"] != list(sub.event_types):
        catalog_types_only(sub.team, payload["event_types"])
    headers = headers_from_form(form, own_headers.names(sub))
    if headers:
        payload["headers"] = headers
    given = filter_from_form(form)
    if given != sub.filter:  # None clears it
        payload["filter"] = given
    auth = auth_from_form(form)
    if auth is not client_auth.UNCHANGED and (auth is not None or sub.auth_ciphertext):
        payload["auth"] = auth
    return checked(schemas.SubscriptionEdit, for_mode(payload | tls_from_form(form, sub), sub.mode))


@both("/subscriptions/<subscription_id>/edit", methods=["GET", "POST"])
@login_required
@owner_action
def edit_subscription(sub):
    # Owners and admins redefine an endpoint; the audit log keeps before and after.
    error, status = None, 200
    if request.method == "POST":
        try:
            changed = subscription_service.edit(sub, edit_from_form(sub, request.form))
        except ApiError as exc:
            db.session.rollback()
            error, status = for_consumer(exc) if in_portal() else exc.message, exc.status
        else:
            flash(f"Saved: {changes_in_words(changed)}." if changed else "Nothing changed: the form was as saved.",
                  "ok")
            return redirect(url_for(".subscription", subscription_id=sub.id))
    form = request.form if request.method == "POST" else None
    chosen = event_types_from_form(form) if form is not None else list(sub.event_types)
    return render_template("owner_tools/edit.html", sub=sub, form=form, error=error,
                           policies=policy_choices(form, sub.max_age_seconds),
                           in_flight_default=panel(sub)["in_flight_default"],
                           picker=catalog_picker(sub.team, chosen)), status


def policy_choices(form, max_age_seconds: int) -> list[tuple[str, str]]:
    """(name, what it does in words) for every retry policy, with the maximum age the form shows."""
    typed = (form or {}).get("max_age_seconds", "").strip()
    max_age = int(typed) if typed.isdigit() else max_age_seconds
    return [(name, contract.policy_in_words(name, max_age)) for name in POLICY_NAMES]


# The edit form's fields as its labels call them, in the order of the form.
FIELD_WORDS = {"url": "endpoint URL", "description": "description", "event_types": "event types",
               "event_versions": "pinned versions", "retry_policy": "retry policy",
               "connect_timeout": "connect timeout", "attempt_timeout": "attempt timeout",
               "max_age_seconds": "maximum event age", "rate_limit_per_s": "rate limit",
               "max_in_flight": "requests in flight", "headers": "headers", "filter": "filter",
               "tls": "client certificate", "auth": "OAuth2 client credentials"}


def _value_in_words(name: str, value) -> str:
    if value in (None, "", [], {}):
        return "the default" if name == "max_in_flight" else "none"
    if name in ("connect_timeout", "attempt_timeout"):
        return f"{value:g} s"
    if name == "max_age_seconds":
        return contract.human(value)
    if name == "rate_limit_per_s":
        return f"{value:g} deliveries/s"
    if name == "filter":
        return json.dumps(value)
    if name == "tls":  # what reads show of it (client_tls.shown)
        return f"{value['subject']}, expires {value['expires_at']}"
    if name == "auth":  # masked (client_auth.audit_view)
        return client_auth.in_words(value)
    if name == "headers":  # names, and masked values (own_headers.audit_view)
        return ", ".join(f"{key}: {shown}" for key, shown in value.items())
    if isinstance(value, dict):
        return ", ".join(f"{key}={version}" for key, version in value.items())
    return ", ".join(value) if isinstance(value, list) else str(value)


def changes_in_words(changed: dict) -> str:
    """{field: (before, after)} as the flash says it: "retry policy quick-then-sweep (was exponential); …".
    The description is long, free text: only that it changed."""
    said = []
    for name in sorted(changed, key=list(FIELD_WORDS).index):
        before, after = changed[name]
        said.append(FIELD_WORDS[name] if name == "description" else
                    f"{FIELD_WORDS[name]} {_value_in_words(name, after)} (was {_value_in_words(name, before)})")
    return "; ".join(said)


def catalog_picker(team, chosen: list[str]) -> dict:
    """The event type picker: the team's catalog (and, on the dashboard, Promesa's own notification types about
    the team) as boxes to tick, ticked where chosen, each with its latest schema and an example body; whatever
    else was chosen (patterns such as file.*) goes in the text box, which a strict team's consumer is not shown."""
    latest = {t.name: t for t in catalog.team_event_types(team)} if team is not None else {}  # by version
    now = current_app.config["CLOCK"].now()
    declared = {name: {"version": t.version, "description": t.description, "schema": json.dumps(t.schema, indent=2),
                       **examples.example_body(t, now)} for name, t in latest.items()}
    own = [] if in_portal() else list(notifications.TEAM_EVENT_TYPES)
    offered = ["*", *latest, *own]
    patterns = ", ".join(name for name in chosen if name not in offered)
    return {"catalog": list(latest), "declared": declared, "own": own, "chosen": set(chosen), "patterns": patterns,
            "typed": bool(patterns) or not (in_portal() and team.strict_event_types)}


@both("/subscriptions/<subscription_id>/rotate-secret", methods=["POST"])
@login_required
@owner_action
def rotate_secret(sub):
    # A new secret, shown once; the old one keeps signing through the grace.
    try:
        grace = schemas.RotateInput.model_validate(
            {"grace_seconds": int(request.form.get("grace_seconds", rotation.DEFAULT_GRACE_SECONDS))}).grace_seconds
    except (ValueError, ValidationError):
        abort(400)
    try:
        secret = rotation.rotate(sub, grace)
    except ApiError as exc:
        flash(exc.message, "error")
        return redirect(url_for(".subscription", subscription_id=sub.id))
    if request.headers.get("HX-Request"):  # swapped into the page: the URL stays, a reload sends nothing
        response = make_response(render_template("owner_tools/_rotated.html", sub=sub, secret=secret,
                                                 tools=panel(sub), oob=True))
        response.headers["Cache-Control"] = "no-store"  # the secret is in this answer only: never kept by a cache
        return response
    return shown_once.show_after_redirect(
        "rotation", sub.id, secret, url_for(".secret_rotated", subscription_id=sub.id),
        lambda: render_template("owner_tools/rotated.html", sub=sub, secret=secret, tools=panel(sub)))


@both("/subscriptions/<subscription_id>/rotated", methods=["GET"])
@login_required
def secret_rotated(subscription_id):
    """Where a rotation without htmx leads: the new secret on the first view only."""
    sub = access.visible_subscription(subscription_id, need=access.can_edit)
    kept = shown_once.take("rotation", sub.id)
    response = make_response(render_template("owner_tools/rotated.html", sub=sub, secret=kept[1] if kept else None,
                                             tools=panel(sub)))
    response.headers["Cache-Control"] = "no-store"  # the secret is in this page only: never kept by a cache
    return response


@both("/subscriptions/<subscription_id>/replace-pull-key", methods=["POST"])
@login_required
@owner_action
def replace_pull_key(sub):
    # A new pull key, shown once; the one before pulls nothing from now on.
    try:
        key = pull_keys.replace(sub)
    except ApiError as exc:
        flash(exc.message, "error")
        return redirect(url_for(".subscription", subscription_id=sub.id))
    return shown_once.show_after_redirect(
        "pull_key", sub.id, key, url_for(".pull_key_replaced", subscription_id=sub.id),
        lambda: render_template("owner_tools/pull_key_replaced.html", sub=sub, pull_key=key))


@both("/subscriptions/<subscription_id>/pull-key", methods=["GET"])
@login_required
def pull_key_replaced(subscription_id):
    """Where replacing a pull key leads: the new key on the first view only."""
    sub = access.visible_subscription(subscription_id, need=access.can_edit)
    kept = shown_once.take("pull_key", sub.id)
    response = make_response(render_template("owner_tools/pull_key_replaced.html", sub=sub,
                                             pull_key=kept[1] if kept else None))
    response.headers["Cache-Control"] = "no-store"  # the key is in this page only: never kept by a cache
    return response


@both("/subscriptions/<subscription_id>/end-grace", methods=["POST"])
@login_required
@owner_action
def end_grace(sub):
    # Only the newest secret signs from now on: for a receiver that has switched, or a leaked old secret.
    ended = rotation.end_grace(sub)
    flash("Grace ended: only the newest secret signs now." if ended else "No previous secret was signing.", "ok")
    return redirect(url_for(".subscription", subscription_id=sub.id))


@both("/subscriptions/<subscription_id>/delete", methods=["POST"])
@login_required
@owner_action
def delete_subscription(sub):
    # Confirmed twice (the button opens a confirmation; the box must be ticked); the history stays.
    if request.form.get("confirm") != "yes":
        flash("Not deleted: tick the box to confirm.", "error")
    else:
        cancelled = subscription_service.delete(sub)
        flash("Deleted: nothing more is sent to it; " + (
            f"{deliveries(cancelled, 'waiting')} {'was' if cancelled == 1 else 'were'} cancelled." if cancelled
            else "no deliveries were waiting.") + " Its history stays readable.", "ok")
        if in_portal():  # the portal lists only endpoints that are there
            return redirect(url_for(".home"))
    return redirect(url_for(".subscription", subscription_id=sub.id))


@both("/subscriptions/<subscription_id>/test", methods=["POST"])
@login_required
@owner_action
def send_test_event(sub):
    # A promesa.test event through the real pipeline; the page polls for its first attempt.
    try:
        _, delivery_id = subscription_service.send_test_event(sub)
    except ApiError as exc:
        if request.headers.get("HX-Request"):
            return render_template("owner_tools/_test_result.html", sub=sub, delivery=None, error=exc.message)
        flash(exc.message, "error")
        return redirect(url_for(".subscription", subscription_id=sub.id))
    if request.headers.get("HX-Request"):
        return render_template("owner_tools/_test_result.html", sub=sub, delivery=db.session.get(Delivery, delivery_id))
    flash("Test event sent.", "ok")
    return redirect(url_for(".delivery", delivery_id=delivery_id))


@both("/subscriptions/<subscription_id>/test/<delivery_id>", methods=["GET"])
@login_required
def test_event_result(subscription_id, delivery_id):
    """The test delivery's outcome; the partial polls itself until the first attempt is recorded."""
    sub = access.visible_subscription(subscription_id)
    return render_template("owner_tools/_test_result.html", sub=sub,
                           delivery=access.of_subscription(Delivery, delivery_id, sub))


def _creatable_teams() -> list[Team]:
    """The teams this user may create subscriptions for (an owner: their own; an admin: every team's)."""
    if current_user.role == "owner" and current_user.team is not None:
        return [current_user.team]
    if not access.is_admin(current_user):
        return []
    return db.session.scalars(select(Team).where(Team.name != access.SYSTEM_TEAM).order_by(Team.name)).all()


@bp.route("/subscriptions/new", methods=["GET", "POST"])
@login_required
def new_subscription():
    # The API's POST /subscriptions as a form: the same model and the same service, so the rules are one.
    teams = _creatable_teams()
    access.require(bool(teams))
    source = request.form if request.method == "POST" else request.args
    team = next((t for t in teams if t.name == source.get("team")), teams[0] if len(teams) == 1 else None)
    error, status = None, 200
    if request.method == "POST":
        try:
            if team is None:
                raise ApiError(400, "choose the team the subscription is for")
            access.require(access.can_create_in(current_user, team.id))
            body = input_from_form(request.form, request.form.get("consumer", "").strip() or None)
            sub, secret = subscription_service.create(team, body)
        except ApiError as exc:
            db.session.rollback()
            error, status = exc.message, exc.status
        else:
            return created(sub, secret)
    return new_form(team, error, status, teams=teams)


def chosen_mode(source) -> str:
    """The mode the new subscription form chose (push unless it says otherwise; the model refuses a wrong one)."""
    return source.get("mode") or SubscriptionMode.PUSH


def input_from_form(form, consumer: str | None) -> schemas.SubscriptionInput:
    """The form as the API's POST body, for this consumer's uid (None: the team's own), checked by its model.
    An empty URL is not given: the service says which mode needs one."""
    mode = chosen_mode(form)
    url = form.get("url", "").strip()
    payload = {**limits_from_form(form, mode), "mode": mode, **({"url": url} if url else {}),
               "signature_scheme": form.get("signature_scheme", ""), "headers": headers_from_form(form, []),
               "consumer": consumer, "filter": filter_from_form(form), "auth": _given(auth_from_form(form)),
               **tls_from_form(form)}
    return checked(schemas.SubscriptionInput, for_mode(payload, mode))


def _given(auth):
    return None if auth is client_auth.UNCHANGED else auth


def new_form(team, error: str | None, status: int, **more):
    """The new subscription's page, blank (in the mode a link asks for) or as posted with the error that refused
    it; a pull form posted with push's boxes filled shows them, to be emptied."""
    form = request.form if request.method == "POST" else None
    chosen = event_types_from_form(form) if form is not None else ["*"]
    mode = chosen_mode(form if form is not None else request.args)
    return render_template("owner_tools/new.html", team=team, form=form, error=error,
                           mode=SubscriptionMode.PULL if mode == SubscriptionMode.PULL else SubscriptionMode.PUSH,
                           push_given=form is not None and push_settings_given(form),
                           policies=policy_choices(form, DEFAULT_MAX_AGE_SECONDS),
                           schemes=schemas.SIGNATURE_SCHEMES,
                           in_flight_default=current_app.config["PROMESA_MAX_IN_FLIGHT_PER_SUBSCRIPTION"],
                           picker=catalog_picker(team, chosen), **more), status


def created(sub, secret: str):
    """Post/redirect/get to the created page, which shows the secret (and a pull subscription's key) once."""
    shown = json.dumps([secret, sub.new_pull_key])
    return shown_once.show_after_redirect(
        "subscription", sub.id, shown, url_for(".subscription_created", subscription_id=sub.id),
        lambda: created_page(sub, secret, sub.new_pull_key))


def created_page(sub, secret: str | None, pull_key: str | None = None) -> str:
    """The created page: the secret (None: shown already) and, for a pull subscription, its key (shown once too)
    and where it is pulled from."""
    pull_url = absolute_for("api.pull_deliveries", subscription_id=sub.id) \
        if sub.mode == SubscriptionMode.PULL else None
    return render_template("owner_tools/created.html", sub=sub, secret=secret, pull_key=pull_key, pull_url=pull_url)


@portal_bp.route("/endpoints/new", methods=["GET", "POST"])
@login_required
def new_endpoint():
    # A consumer adds its own endpoint: the dashboard's form, model and service, for this consumer of this team.
    access.require(in_portal())
    team = db.session.get(Team, current_user.team_id)
    error, status = None, 200
    if request.method == "POST":
        try:
            body = input_from_form(request.form, db.session.get(Consumer, current_user.consumer_id).uid)
            catalog_types_only(team, list(body.event_types))
            sub, secret = subscription_service.create(team, body)
        except ApiError as exc:
            db.session.rollback()
            error, status = for_consumer(exc), exc.status
        else:
            return created(sub, secret)
    return new_form(team, error, status)


@both("/subscriptions/<subscription_id>/created", methods=["GET"])
@login_required
def subscription_created(subscription_id):
    """Where creating a subscription leads: its signing secret on the first view only, never cached."""
    sub = access.visible_subscription(subscription_id, need=access.can_edit)
    kept = shown_once.take("subscription", sub.id)
    secret, pull_key = json.loads(kept[1]) if kept else (None, None)
    response = make_response(created_page(sub, secret, pull_key))
    response.headers["Cache-Control"] = "no-store"  # the secret is in this page only
    return response


def _filter_team() -> Team:
    """The team whose catalog a filter is tried on: the portal's own; on the dashboard, the subscription's being
    edited, or the team a new one is for (404 for a team the user does not see)."""
    if access.is_portal(current_user):
        return db.session.get(Team, current_user.team_id)
    subscription_id = request.form.get("subscription_id")
    if subscription_id:
        return access.visible_subscription(subscription_id).team
    team = db.session.scalar(select(Team).where(Team.name == request.form.get("team", "")))
    if team is None or not access.can_view_team(current_user, team.id):
        abort(404)
    return team


@both("/subscriptions/filter-try", methods=["POST"])
@login_required
def try_filter():
    """The form's filter tried on the example body of a catalog type (htmx): would that event be sent?"""
    name = request.form.get("filter_example", "")
    declared = {t.name: t for t in catalog.team_event_types(_filter_team())}.get(name)
    if declared is None:
        return render_template("owner_tools/_filter_tried.html", error="choose an event type of the catalog to try "
                                                                        "the filter on its example")
    body = json.loads(examples.example_body(declared, current_app.config["CLOCK"].now())["body"])
    try:
        spec = filter_from_form(request.form)
        matched = spec is None or filters.matches(spec, body)
    except ApiError as exc:
        return render_template("owner_tools/_filter_tried.html", error=exc.message)
    return render_template("owner_tools/_filter_tried.html", error=None, matched=matched, name=name,
                           filtered=spec is not None)
