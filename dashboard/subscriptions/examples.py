"""An example body for each declared event type, made from its schema: what the picker of a new endpoint shows
beside the schema, so whoever subscribes sees what will arrive.

The example is the same every time (no random values, unlike the fakers on PyPI, which also bring Faker or
Hypothesis and fetch remote $refs): the schema's own `examples`, `const`, `default` or first `enum` value where it
gives one, else the simplest value of its type within its bounds. A team's schema is bounded at declaration
(catalog.check_schema); a $ref back into itself is not followed again, and the walk stops after MAX_NODES.
"""

from __future__ import annotations

import json

import referencing
import referencing.exceptions
import referencing.jsonschema

from dashboard.core.clock import iso
from dashboard.core.validation import ApiError
from dashboard.ingest import catalog
from dashboard.models import EventType

MAX_NODES = 500  # subschemas one example may walk
EXAMPLE_EVENT_ID = "evt_01JEXAMPLE0000000000000000"
# Strings of a known format, so a date reads as a date.
FORMATS = {"date-time": "2026-01-01T12:00:00Z", "date": "2026-01-01", "time": "12:00:00Z",
           "email": "someone@example.com", "idn-email": "someone@example.com", "hostname": "example.com",
           "idn-hostname": "example.com", "ipv4": "192.0.2.1", "ipv6": "2001:db8::1", "uri": "https://example.com/",
           "iri": "https://example.com/", "uri-reference": "/example", "uuid": "123e4567-e89b-12d3-a456-426614174000",
           "duration": "PT1H"}
_OMIT = object()  # a property or item whose example would be the schema again (recursion): left out


class _Walk:
    def __init__(self, schema):
        resource = referencing.jsonschema.specification_with(
            schema.get("$schema", "") if isinstance(schema, dict) else "",
            default=referencing.jsonschema.DRAFT202012).create_resource(schema)
        base = resource.id() or ""
        self.resolver = referencing.Registry().with_resource(base, resource).resolver(base)
        self.nodes = 0

    def value(self, node, following: tuple = ()):
        self.nodes += 1
        if not isinstance(node, dict) or self.nodes > MAX_NODES:
            return None
        for given in ("examples", "const", "default", "enum"):
            if given in node:
                value = node[given]
                if given not in ("examples", "enum"):
                    return value
                if isinstance(value, list) and value:
                    return value[0]
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in following:
                return _OMIT
            try:
                target = self.resolver.lookup(ref).contents
            except referencing.exceptions.Unresolvable:
                return None
            return self.value(target, (*following, ref))
        if isinstance(node.get("allOf"), list) and node["allOf"]:
            parts = [self.value(part, following) for part in node["allOf"]]
            if all(isinstance(part, dict) for part in parts):
                return {key: value for part in parts for key, value in part.items()}
            return next((part for part in parts if part is not None and part is not _OMIT), None)
        for choice in ("oneOf", "anyOf"):
            if isinstance(node.get(choice), list) and node[choice]:
                return self.value(node[choice][0], following)
        kind = node.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in node else "array" if "items" in node else None
        return self.typed(kind, node, following)

    def typed(self, kind, node, following):
        if kind == "object":
            return self.object(node, following)
        if kind == "array":
            return self.array(node, following)
        if kind == "string":
            text = FORMATS.get(node.get("format"), "string")
            least, most = node.get("minLength", 0), node.get("maxLength")
            text = text + "x" * max(0, least - len(text)) if isinstance(least, int) else text
            return text[:most] if isinstance(most, int) else text
        if kind in ("integer", "number"):
            return _number(node, int if kind == "integer" else float)
        if kind == "boolean":
            return True
        return None

    def object(self, node, following):
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        example = {}
        for name, subschema in properties.items():
            value = self.value(subschema, following)
            if value is not _OMIT:
                example[name] = value
        for name in node.get("required", []) if isinstance(node.get("required"), list) else []:
            if isinstance(name, str) and name not in example:
                example[name] = "string"
        return example

    def array(self, node, following):
        if node.get("maxItems") == 0:
            return []
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        items = node.get("items")
        if isinstance(items, list):  # draft 4 to 2019-09: items as a tuple
            prefix, items = items, None
        values = [self.value(item, following) for item in prefix]
        if isinstance(items, dict):
            least = node.get("minItems", 1) if isinstance(node.get("minItems"), int) else 1
            values += [self.value(items, following) for _ in range(max(1, least) - len(values))]
        return [value for value in values if value is not _OMIT]


def _number(node, kind):
    """The bound nearest 0 that the schema allows (its minimum, or 0 or 1 inside its bounds)."""
    low, high = node.get("minimum"), node.get("maximum")
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
        low = node["exclusiveMinimum"] + (1 if kind is int else 0.5)
    if isinstance(node.get("exclusiveMaximum"), (int, float)) and not isinstance(node["exclusiveMaximum"], bool):
        high = node["exclusiveMaximum"] - (1 if kind is int else 0.5)
    value = 1
    if isinstance(low, (int, float)) and value < low:
        value = low
    if isinstance(high, (int, float)) and value > high:
        value = high
    step = node.get("multipleOf")
    if isinstance(step, (int, float)) and step > 0 and value % step:
        value = (value // step + 1) * step
    return kind(value)


def example_data(schema) -> object:
    """A `data` value for this schema: the same every time."""
    value = _Walk(schema).value(schema, ("#",))  # a $ref to the root is recursion too
    return None if value is _OMIT else value


def example_body(declared: EventType, now) -> dict:
    """The body a subscriber of this type receives, with example data, as text; and whether the data meets the
    whole schema (a pattern, say, is beyond a simple example), so the page can say when it is only a sketch."""
    data = example_data(declared.schema)
    try:
        catalog.validate_data(declared, data)
        fits = True
    except ApiError:
        fits = False
    body = {"id": EXAMPLE_EVENT_ID, "type": declared.name, "version": declared.version, "timestamp": iso(now),
            "data": data}
    return {"body": json.dumps(body, indent=2), "fits": fits}
