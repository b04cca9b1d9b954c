"""A team's incidents over the API, for on-call tooling: list and read them, acknowledge with a note, snooze
(and end a snooze), resolve by hand, each as the incident's page does it (audited, the sinks told), with the
token as the actor."""

from __future__ import annotations

from flask import g, jsonify
from sqlalchemy import select

from dashboard import schemas
from dashboard.core import paging
from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, parse_time
from dashboard.models import Incident
from dashboard.operations import incidents as incident_service
from dashboard.web.api import bp, shapes
from dashboard.web.api.operations import operation


def _team_incident(incident_id: str) -> Incident:
    # Promesa's own (no team) and other teams' incidents do not exist for a team's token.
    incident = db.session.get(Incident, incident_id)
    if incident is None or incident.team_id != g.team.id:
        raise ApiError(404, f"no incident {incident_id!r} in your team")
    return incident


def _who() -> str:
    return f"API token {g.api_token_prefix}"


@bp.get("/incidents")
@operation("The team's incidents, a page at a time, newest first", query=schemas.IncidentsQuery,
           responses={200: schemas.IncidentList})
def list_incidents(query: schemas.IncidentsQuery):
    found = select(Incident).where(Incident.team_id == g.team.id)
    if query.state:
        found = found.where(Incident.state == query.state)
    page, next_before = paging.by_id(found, Incident.id, query.limit, query.before)
    return jsonify(data=[shapes.incident(i) for i in page], next_before=next_before)


@bp.get("/incidents/<incident_id>")
@operation("One incident", responses={200: schemas.Incident})
def get_incident(incident_id):
    return jsonify(shapes.incident(_team_incident(incident_id)))


@bp.post("/incidents/<incident_id>/acknowledge")
@operation("Acknowledge an open incident, optionally with a note: the sinks are told who is on it",
           body=schemas.AcknowledgeInput, body_required=False, responses={200: schemas.Incident}, errors=(409,))
def acknowledge_incident(incident_id, body: schemas.AcknowledgeInput):
    incident = _team_incident(incident_id)
    if incident_service.acknowledge(incident, _who(), body.note) is None:
        raise ApiError(409, f"this incident is {incident.state}: only an open one can be acknowledged")
    return jsonify(shapes.incident(incident))


@bp.post("/incidents/<incident_id>/snooze")
@operation("Snooze an incident: no notifications about it until then (it stays listed and still resolves by "
           "itself; if its cause comes back before then, the new incident is snoozed too)",
           body=schemas.SnoozeInput, responses={200: schemas.Incident}, errors=(409, 422))
def snooze_incident(incident_id, body: schemas.SnoozeInput):
    incident = _team_incident(incident_id)
    incident_service.snooze(incident, _who(), parse_time(body.until, "until"))
    return jsonify(shapes.incident(incident))


@bp.post("/incidents/<incident_id>/unsnooze")
@operation("End an incident's snooze now: notifications about it, and about its cause should it return, resume",
           responses={200: schemas.Incident}, errors=(409,))
def end_incident_snooze(incident_id):
    incident = _team_incident(incident_id)
    if not incident_service.end_snooze(incident):
        raise ApiError(409, "this incident is not snoozed")
    return jsonify(shapes.incident(incident))


@bp.post("/incidents/<incident_id>/resolve")
@operation("Resolve an incident by hand (the cause is fixed, or it was noise); if its rule still fires, the "
           "next sweep opens a new one", responses={200: schemas.Incident}, errors=(409,))
def resolve_incident(incident_id):
    incident = _team_incident(incident_id)
    if incident_service.resolve(incident, _who()) is None:
        raise ApiError(409, "this incident is already resolved")
    return jsonify(shapes.incident(incident))

