"""The OpenAPI 3.1 document of the producer API, served at /api/v1/openapi.json."""

from __future__ import annotations

from ..delivery.policies import POLICY_NAMES
from ..models import DeliveryState

_ERROR = {"description": "what is wrong", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _errors(*codes):
    return {str(c): _ERROR for c in codes}


def _json(schema_ref):
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def _id_param(name):
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def document() -> dict:
    subscription_input = {
        "type": "object", "additionalProperties": False, "required": ["url"],
        "properties": {
            "url": {"type": "string", "format": "uri", "maxLength": 2048},
            "event_types": {"type": "array", "items": {"type": "string"}, "default": ["*"],
                            "description": "type names or fnmatch patterns such as 'file.*'"},
            "event_versions": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1},
                               "description": "pin a type to one version, e.g. {\"file.updated\": 2}; "
                                              "types not named arrive in every version"},
            "retry_policy": {"type": "string", "enum": list(POLICY_NAMES), "default": "exponential"},
            "signature_scheme": {"type": "string", "enum": ["promesa", "standard-webhooks"], "default": "promesa"},
            "description": {"type": "string", "maxLength": 500},
            "connect_timeout": {"type": "number", "minimum": 0.1, "maximum": 5, "default": 5},
            "attempt_timeout": {"type": "number", "minimum": 0.1, "maximum": 10, "default": 10},
            "max_age_seconds": {"type": "integer", "minimum": 60, "maximum": 604800, "default": 86400},
            "rate_limit_per_s": {"type": ["number", "null"], "minimum": 0.01, "maximum": 10000, "default": None,
                                 "description": "deliveries per second to this endpoint across all workers; "
                                                "null: no limit. A throttled delivery waits its turn: it is not "
                                                "an attempt and does not count in the retry schedule"},
            "max_in_flight": {"type": ["integer", "null"], "minimum": 1, "maximum": 64, "default": None,
                              "description": "requests in flight to this endpoint per worker; "
                                             "null: the installation's default (8)"},
        },
    }
    # An edit: any of the fields above but the signature scheme, none required.
    subscription_edit = {"type": "object", "additionalProperties": False, "minProperties": 1,
                         "properties": {k: v for k, v in subscription_input["properties"].items()
                                        if k != "signature_scheme"}}
    subscription = {
        "type": "object",
        "properties": {**subscription_input["properties"], "id": {"type": "string"},
                       "state": {"type": "string", "enum": ["active", "paused", "disabled"]},
                       "state_reason": {"type": ["string", "null"]}, "created_at": {"type": "string"},
                       "deleted_at": {"type": ["string", "null"],
                                      "description": "set when deleted: nothing more is attempted"},
                       "signing_secrets": {
                           "type": "array", "description": "which secrets sign deliveries, and until when "
                                                           "(never their values): the current one, and the "
                                                           "previous one during a rotation's grace",
                           "items": {"type": "object", "properties": {
                               "which": {"type": "string", "enum": ["current", "previous"]},
                               "until": {"type": ["string", "null"]}}}}},
    }
    attempt = {"type": "object", "properties": {
        "number": {"type": "integer"}, "attempted_at": {"type": "string"}, "duration_ms": {"type": "integer"},
        "status_code": {"type": ["integer", "null"]}, "error": {"type": ["string", "null"]},
        "response_excerpt": {"type": ["string", "null"]}}}
    delivery = {"type": "object", "properties": {
        "id": {"type": "string"}, "event_id": {"type": "string"}, "subscription_id": {"type": "string"},
        "state": {"type": "string", "enum": list(DeliveryState.ALL)}, "attempt_count": {"type": "integer"},
        "next_attempt_at": {"type": ["string", "null"]}, "last_status_code": {"type": ["integer", "null"]},
        "last_error": {"type": ["string", "null"]}, "created_at": {"type": "string"},
        "succeeded_at": {"type": ["string", "null"]}, "dead_lettered_at": {"type": ["string", "null"]},
        "attempts": {"type": "array", "items": {"$ref": "#/components/schemas/Attempt"}}}}
    sub_id = _id_param("subscription_id")
    return {
        "openapi": "3.1.0",
        "info": {"title": "Promesa producer API", "version": "1",
                 "description": "Hand events to Promesa; it signs them and delivers them to every matching "
                                "subscription at least once, retrying with backoff."},
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearer": []}],
        "paths": {
            "/events": {"post": {
                "summary": "Accept an event for delivery",
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                "schema": {"type": "string", "maxLength": 255},
                                "description": "a repeated key returns the first event instead of a second"}],
                "requestBody": {"required": True, **_json("EventInput")},
                "responses": {"202": {"description": "stored; deliveries enqueued", **_json("Accepted")},
                              **_errors(400, 401, 409, 413, 415, 422)}}},
            "/events/batch": {"post": {
                "summary": "Accept up to 500 events in one request and one transaction; one bad event "
                           "rejects the batch (the error names its index) and nothing is stored",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False, "required": ["events"],
                    "properties": {"events": {"type": "array", "minItems": 1, "maxItems": 500,
                                              "items": {"$ref": "#/components/schemas/EventInput"}}}}}}},
                "responses": {"202": {"description": "stored; deliveries enqueued", "content": {
                    "application/json": {"schema": {"type": "object", "properties": {"data": {
                        "type": "array", "items": {"$ref": "#/components/schemas/Accepted"}}}}}}},
                    **_errors(400, 401, 409, 413, 415, 422)}}},
            "/events/{event_id}": {"get": {
                "summary": "An event with its deliveries and their attempts",
                "parameters": [_id_param("event_id")],
                "responses": {"200": {"description": "the event", **_json("Event")}, **_errors(401, 404)}}},
            "/subscriptions": {
                "post": {"summary": "Create a subscription; its signing secret is shown in this answer only",
                         "requestBody": {"required": True, **_json("SubscriptionInput")},
                         "responses": {"201": {"description": "created", **_json("SubscriptionWithSecret")},
                                       **_errors(400, 401, 415, 422)}},
                "get": {"summary": "The team's subscriptions",
                        "responses": {"200": {"description": "list", "content": {"application/json": {"schema": {
                            "type": "object", "properties": {"data": {"type": "array", "items": {
                                "$ref": "#/components/schemas/Subscription"}}}}}}}, **_errors(401)}}},
            "/subscriptions/{subscription_id}": {
                "get": {"summary": "One subscription (a deleted one too: its history stays readable)",
                        "parameters": [sub_id],
                        "responses": {"200": {"description": "the subscription", **_json("Subscription")},
                                      **_errors(401, 404)}},
                "patch": {"summary": "Edit: url (checked as at creation), event types and versions, retry policy, "
                                     "timeouts, description, rate limit, in-flight cap. The audit log keeps "
                                     "before and after",
                          "parameters": [sub_id], "requestBody": {"required": True, **_json("SubscriptionEdit")},
                          "responses": {"200": {"description": "edited", **_json("Subscription")},
                                        **_errors(400, 401, 404, 409, 415, 422)}},
                "delete": {"summary": "Delete: nothing more is attempted, waiting deliveries end cancelled, "
                                      "the history stays readable",
                           "parameters": [sub_id],
                           "responses": {"200": {"description": "deleted", "content": {"application/json": {
                               "schema": {"allOf": [{"$ref": "#/components/schemas/Subscription"}, {
                                   "type": "object", "properties": {"cancelled": {"type": "integer"}}}]}}}},
                               **_errors(401, 404, 409)}}},
            "/subscriptions/{subscription_id}/rotate-secret": {"post": {
                "summary": "Rotate the signing secret; the new one is shown in this answer only. During the "
                           "grace both sign every delivery (X-Signature: t=…,v1=<new>,v1=<old>; Standard "
                           "Webhooks: v1,<new> v1,<old>); at most two secrets sign",
                "parameters": [sub_id],
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False, "properties": {"grace_seconds": {
                        "type": "integer", "minimum": 0, "maximum": 604800, "default": 86400,
                        "description": "how long the previous secret keeps signing; 0: not at all"}}}}}},
                "responses": {"200": {"description": "rotated", **_json("SubscriptionWithSecret")},
                              **_errors(400, 401, 404, 409, 415)}}},
            "/subscriptions/{subscription_id}/end-grace": {"post": {
                "summary": "End a rotation's grace now: only the newest secret signs; the previous one is deleted",
                "parameters": [sub_id],
                "responses": {"200": {"description": "only the newest secret signs", **_json("Subscription")},
                              **_errors(401, 404, 409)}}},
            "/subscriptions/{subscription_id}/test": {"post": {
                "summary": "Send a promesa.test event to this endpoint alone, through the real pipeline "
                           "(whatever its type filter and the catalog's strict mode say)",
                "parameters": [sub_id],
                "responses": {"202": {"description": "accepted; follow the delivery", "content": {
                    "application/json": {"schema": {"type": "object", "properties": {
                        "event_id": {"type": "string"}, "delivery_id": {"type": "string"}}}}}},
                    **_errors(401, 404, 409)}}},
            "/subscriptions/{subscription_id}/contract": {"get": {
                "summary": "The subscription's published contract, generated from its live configuration",
                "parameters": [sub_id],
                "responses": {"200": {"description": "guarantees, schedule, signature and verification code",
                                      "content": {"application/json": {"schema": {"type": "object"}}}},
                              **_errors(401, 404)}}},
            "/subscriptions/{subscription_id}/pause": {"post": {
                "summary": "Pause: deliveries are held, nothing is dropped", "parameters": [sub_id],
                "responses": {"200": {"description": "paused", **_json("Subscription")}, **_errors(401, 404)}}},
            "/subscriptions/{subscription_id}/resume": {"post": {
                "summary": "Resume: held deliveries are sent", "parameters": [sub_id],
                "responses": {"200": {"description": "active again", **_json("Subscription")},
                              **_errors(401, 404)}}},
            "/subscriptions/{subscription_id}/replay": {"post": {
                "summary": "Replay every dead letter, or re-send the given dead or succeeded deliveries, "
                           "with a fresh retry schedule",
                "parameters": [sub_id],
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"delivery_ids": {"type": "array", "items": {"type": "string"}}}}}}},
                "responses": {"202": {"description": "replay enqueued", "content": {"application/json": {
                    "schema": {"type": "object", "properties": {"replayed": {"type": "integer"}}}}}},
                    **_errors(400, 401, 404)}}},
            "/subscriptions/{subscription_id}/deliveries": {"get": {
                "summary": "The subscription's deliveries, newest first",
                "parameters": [sub_id,
                               {"name": "state", "in": "query", "schema": {"type": "string",
                                                                           "enum": list(DeliveryState.ALL)}},
                               {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                           "maximum": 100, "default": 50}},
                               {"name": "before", "in": "query", "schema": {"type": "string"},
                                "description": "the next_before of the previous page"}],
                "responses": {"200": {"description": "a page", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {
                        "data": {"type": "array", "items": {"$ref": "#/components/schemas/Delivery"}},
                        "next_before": {"type": ["string", "null"]}}}}}}, **_errors(400, 401, 404)}}},
            "/event-types": {
                "post": {"summary": "Declare an event type version with a JSON Schema for its data",
                         "requestBody": {"required": True, **_json("EventTypeInput")},
                         "responses": {"201": {"description": "declared", **_json("EventType")},
                                       **_errors(400, 401, 409, 415, 422)}},
                "get": {"summary": "The team's event-type catalog",
                        "responses": {"200": {"description": "list", "content": {"application/json": {"schema": {
                            "type": "object", "properties": {"data": {"type": "array", "items": {
                                "$ref": "#/components/schemas/EventType"}}}}}}}, **_errors(401)}}},
            "/team": {
                "get": {"summary": "The team's settings",
                        "responses": {"200": {"description": "settings", **_json("Team")}, **_errors(401)}},
                "patch": {"summary": "Change the team's settings (strict mode: only declared event types)",
                          "requestBody": {"required": True, **_json("Team")},
                          "responses": {"200": {"description": "settings", **_json("Team")},
                                        **_errors(400, 401, 415)}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [],
                                      "responses": {"200": {"description": "OpenAPI 3.1"}}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a team token from `promesa tokens create`"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "EventTypeInput": {"type": "object", "additionalProperties": False, "required": ["name", "schema"],
                                   "properties": {"name": {"type": "string"},
                                                  "version": {"type": "integer", "minimum": 1, "default": 1},
                                                  "description": {"type": "string", "maxLength": 1000},
                                                  "schema": {"type": "object",
                                                             "description": "JSON Schema of the event's data"}}},
                "EventType": {"type": "object", "properties": {
                    "name": {"type": "string"}, "version": {"type": "integer"}, "description": {"type": "string"},
                    "schema": {"type": "object"}, "created_at": {"type": "string"}}},
                "Team": {"type": "object", "additionalProperties": False,
                         "properties": {"name": {"type": "string", "readOnly": True},
                                        "strict_event_types": {"type": "boolean"}}},
                "EventInput": {"type": "object", "additionalProperties": False, "required": ["type"],
                               "properties": {"type": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$"},
                                              "version": {"type": "integer", "minimum": 1,
                                                          "description": "default: the latest declared version, else 1"},
                                              "timestamp": {"type": "string", "format": "date-time",
                                                            "description": "when it happened (default: when accepted)"},
                                              "data": {"type": "object", "description": "ids, versions and times only; at most 8 KB"},
                                              "id": {"type": "string", "maxLength": 64,
                                                     "description": "your stable id; repeating it returns the first event"}}},
                "Accepted": {"type": "object", "properties": {"id": {"type": "string"},
                                                              "deliveries": {"type": "integer"},
                                                              "duplicate": {"type": "boolean"}}},
                "Event": {"type": "object", "properties": {
                    "id": {"type": "string"}, "type": {"type": "string"}, "version": {"type": "integer"},
                    "timestamp": {"type": "string"}, "data": {"type": "object"},
                    "deliveries": {"type": "array", "items": {"$ref": "#/components/schemas/Delivery"}}}},
                "SubscriptionInput": subscription_input,
                "SubscriptionEdit": subscription_edit,
                "Subscription": subscription,
                "SubscriptionWithSecret": {"allOf": [{"$ref": "#/components/schemas/Subscription"}, {
                    "type": "object", "properties": {"secret": {"type": "string",
                                                                "description": "whsec_...; shown once"}}}]},
                "Delivery": delivery,
                "Attempt": attempt,
            },
        },
    }
