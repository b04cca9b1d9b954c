"""The OpenAPI 3.1 document of the producer API, served at /api/v1/openapi.json.

Nothing here is written by hand per route: the paths come from the URL map, and each operation's
summary, body, query, answers and errors from its `@operation` declaration (`operations.py`);
the schemas are the pydantic models that validate the requests (`dashboard/schemas.py`), as JSON Schema
2020-12, which OpenAPI 3.1 uses as is.
"""

from __future__ import annotations

import re

from flask import Flask
from pydantic.json_schema import models_json_schema

from dashboard import schemas
from dashboard.core.validation import ID_PATTERN
from dashboard.web.api.operations import Operation

PREFIX = "/api/v1"
_REF = "#/components/schemas/{model}"
_PATH_ARGUMENT = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
ERROR_WORDS = {400: "the request is malformed: the message names the field and says why",
               401: "no valid team token", 404: "no such resource in your team",
               409: "conflicts with what is stored", 413: "the body or its data is larger than the limit",
               415: "the body is not JSON", 422: "well-formed, but refused: the message says why",
               429: "too soon, or past one of the team's quotas (named in `quota`): try again after Retry-After seconds",
               503: "the service cannot take it now (its database is away, or this server is full): try again "
                    "after Retry-After seconds"}
# Errors whose body says more than Error: the quota refused, with its name and limit.
ERROR_MODELS = {429: "QuotaError"}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before sending again",
                               "schema": {"type": "integer", "minimum": 1}}}


def document(app: Flask) -> dict:
    """Built once per app: the routes do not change while it runs."""
    if "promesa_openapi" not in app.extensions:
        app.extensions["promesa_openapi"] = build(app)
    return app.extensions["promesa_openapi"]


def _operations(app: Flask) -> list[tuple[str, str, str, Operation, list[str]]]:
    """(path, method, operation id, declaration, path parameters) for every API route."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith(PREFIX + "/"):
            continue
        declared = getattr(app.view_functions[rule.endpoint], "api_operation", None)
        if declared is None:
            raise RuntimeError(f"{rule.rule} has no @operation declaration: see dashboard/api/operations.py")
        path = _PATH_ARGUMENT.sub(r"{\1}", rule.rule.removeprefix(PREFIX))
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            found.append((path, method.lower(), rule.endpoint.rsplit(".", 1)[-1], declared,
                          _PATH_ARGUMENT.findall(rule.rule)))
    return sorted(found)


def build(app: Flask) -> dict:
    operations = _operations(app)
    models = {schemas.Error, schemas.QuotaError}
    for *_, declared, _ in operations:
        models |= {m for m in (declared.body, *declared.responses.values()) if m is not None}
    _, definitions = models_json_schema(
        [(m, "validation" if m is not None and issubclass(m, schemas.Body) else "serialization")
         for m in sorted(models, key=lambda m: m.__name__)], ref_template=_REF)
    paths: dict[str, dict] = {}
    for path, method, operation_id, declared, path_arguments in operations:
        paths.setdefault(path, {})[method] = _operation(path, operation_id, declared, path_arguments, operations)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Promesa producer API", "version": "1",
                 "description": "Hand events to Promesa; it signs them and delivers them to every matching "
                                "subscription at least once, retrying with backoff."},
        "servers": [{"url": PREFIX}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a team token from `promesa tokens create` (the "
                                                          "pull routes also take their subscription's pull key)"}},
            "schemas": definitions.get("$defs", {}),
        },
    }


def _without_null(schema: dict) -> dict:
    """A query parameter is absent or text, never null: `X | None` documents as X."""
    branches = [s for s in schema.get("anyOf", ()) if s != {"type": "null"}]
    if len(branches) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf" and not (k == "default" and v is None)}
    return rest | branches[0]


def _operation(path: str, operation_id: str, declared: Operation, path_arguments: list[str],
               operations: list) -> dict:
    out: dict = {"operationId": operation_id, "summary": declared.summary}
    parameters = [{"name": name, "in": "path", "required": True,
                   "schema": {"type": "string", "pattern": ID_PATTERN}} for name in path_arguments]
    parameters += list(declared.headers)
    if declared.query is not None:
        query_schema = declared.query.model_json_schema(ref_template=_REF)
        for name, schema in query_schema["properties"].items():
            description = schema.pop("description", None)
            schema = _without_null(schema)
            parameters.append({"name": name, "in": "query", "required": name in query_schema.get("required", ()),
                               "schema": schema} | ({"description": description} if description else {}))
    if parameters:
        out["parameters"] = parameters
    if declared.public:
        out["security"] = []
    errors = set(declared.errors)
    if not declared.public:
        errors.add(401)
    if declared.body is not None:
        out["requestBody"] = {"required": declared.body_required, "content": {"application/json": {
            "schema": {"$ref": _REF.format(model=declared.body.__name__)}}}}
        errors |= {400, 413, 415}
    if declared.query is not None or path_arguments:
        errors.add(400)  # a value the query model refuses, or NUL in a path segment
    if path_arguments:
        errors.add(404)
    responses: dict[str, dict] = {}
    for status, model in declared.responses.items():
        response = {"description": "success"}
        if model is not None:
            response["content"] = {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}}
        if declared.links_to:
            response["links"] = {f"{target}": {"operationId": target,
                                               "parameters": {declared.links_to: "$response.body#/id"}}
                                 for _, _, target, _, arguments in operations if declared.links_to in arguments}
        responses[str(status)] = response
    for status in sorted(errors):
        responses[str(status)] = {"description": ERROR_WORDS[status], "content": {"application/json": {
            "schema": {"$ref": _REF.format(model=ERROR_MODELS.get(status, "Error"))}}}}
        if status in (429, 503):
            responses[str(status)]["headers"] = RETRY_AFTER
    out["responses"] = responses
    return out
