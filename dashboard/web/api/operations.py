"""How an API endpoint is declared: one decorator that validates and documents.

Adding an endpoint (say `DELETE /subscriptions/<subscription_id>`):

1. If it takes a body, write its model in `dashboard/schemas.py` as a subclass of `Body`, built from the
   constrained types in `dashboard.core.validation` (each field says in `Must(...)` what it must be:
   that is the error message). A query string gets a model too (see `DeliveriesQuery`).
2. Write the view under the Flask route, with `@operation` below it:

       @bp.delete("/subscriptions/<subscription_id>")
       @operation("Delete a subscription", responses={200: schemas.Subscription}, errors=(409,))
       def delete_subscription(subscription_id):
           ...

   `@operation(body=Model)` passes the validated body as `body=`; `query=Model` passes `query=`.
   Every operation needs a team token unless `public=True` (g.team is the caller's team).
   `token_read_by_view=True` leaves the token's lookup to the view, which finds the team inside a
   statement it makes anyway (`g.bearer_digest`; see `create_event`).
   `errors` lists the statuses the view itself raises (ApiError); the ones the machinery raises
   are added for you: 401 (token), 400 / 413 / 415 (a body), 400 (a query or an id in the path),
   404 (an id in the path).
3. That is all: `openapi.py` builds the document from these declarations and the URL map, and
   `tests/test_api_fuzz.py` fuzzes the new operation with schemathesis from that document.
   `links_to="subscription_id"` says the answer's `id` is what that path parameter takes, so the
   fuzzer's stateful phase can go on from it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from flask import current_app, g, request
from pydantic import BaseModel, ValidationError
from sqlalchemy import bindparam, select

from dashboard.core.extensions import db
from dashboard.core.validation import ApiError, explain, expired_token, invalid_token, parse_json
from dashboard.models import ApiToken, Team


@dataclass(frozen=True)
class Operation:
    summary: str
    responses: dict[int, type[BaseModel] | None]  # success status -> the model of its body (None: no schema)
    body: type[BaseModel] | None = None
    body_required: bool = True
    query: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    public: bool = False
    links_to: str | None = None
    headers: tuple[dict, ...] = field(default=())  # OpenAPI parameter objects for request headers
    token_read_by_view: bool = False
    # The view's own authentication, called with the path's arguments instead of the team token's.
    authenticate: Callable[..., object] | None = None


def operation(summary: str, *, responses: dict, body: type[BaseModel] | None = None, body_required: bool = True,
              query: type[BaseModel] | None = None, errors: tuple[int, ...] = (), public: bool = False,
              links_to: str | None = None, headers: tuple[dict, ...] = (), token_read_by_view: bool = False,
              authenticate_with: Callable[..., object] | None = None):
    """Declare an API operation: authenticate, validate the body and query with their models, and
    record all of it for the OpenAPI document (see this module's docstring)."""
    declared = Operation(summary, responses, body, body_required, query, errors, public, links_to, headers,
                         token_read_by_view, authenticate_with)

    def decorate(view):
        @functools.wraps(view)
        def wrapped(**path):
            if declared.token_read_by_view:
                g.bearer_digest = ApiToken.digest(bearer_token())
            elif declared.authenticate is not None:
                declared.authenticate(**path)
            elif not declared.public:
                authenticate()
            try:
                if declared.body is not None:
                    path["body"] = read_body(declared.body, declared.body_required)
                if declared.query is not None:
                    path["query"] = read_query(declared.query)
                return view(**path)
            except ApiError as exc:
                if declared.token_read_by_view and exc.status != 401:
                    authenticate()  # a bad token is told before a bad body, as everywhere else
                raise

        wrapped.api_operation = declared
        return wrapped

    return decorate


# Built once: every API request runs it (the revoked check stays in the query, so revoking takes effect at once).
_TEAM_BY_TOKEN = (select(Team, ApiToken.display_prefix, ApiToken.expires_at).join(ApiToken, ApiToken.team_id == Team.id)
                  .where(ApiToken.token_sha256 == bindparam("digest"), ApiToken.revoked_at.is_(None)))


def authenticate() -> Team:
    """The team whose bearer token came with the request, as g.team (and the token's prefix as
    g.api_token_prefix, which names the actor in the audit log); 401 without one."""
    g.bearer_digest = ApiToken.digest(bearer_token())
    found = db.session.execute(_TEAM_BY_TOKEN, {"digest": g.bearer_digest}).first()
    if found is None:
        raise invalid_token()
    g.team, g.api_token_prefix, expires_at = found
    if expires_at is not None and expires_at <= current_app.config["CLOCK"].now():
        raise expired_token(expires_at)
    return g.team


def bearer_token() -> str:
    """The request's bearer token, as sent; 401 if there is none."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <team token>'")
    return token.strip()


def read_body(model: type[BaseModel], required: bool = True) -> BaseModel:
    """The JSON body validated by `model`: 415 unless it is JSON, 400 naming what is wrong."""
    if not required and not request.content_length:
        return model()
    if not request.is_json:
        raise ApiError(415, "send the body as JSON with 'Content-Type: application/json'")
    return parse_json(model, request.get_data(cache=False))


def read_query(model: type[BaseModel]) -> BaseModel:
    try:
        return model.model_validate(request.args.to_dict())
    except ValidationError as exc:
        raise ApiError(400, explain(model, exc)) from None
