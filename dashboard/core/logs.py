"""How every Promesa process writes its log: text lines (the default), or with PROMESA_LOG_FORMAT=json one JSON
object per line, for a log pipeline to index: time, level, logger, process, message, and the ids the line is
about (the public ids its message names, and any `*_id` given as `extra=`), plus the traceback when there is one.

The CLI's processes (worker, sweeper, up, ...) call `configure`; gunicorn's web processes take `gunicorn_logconfig`
as their logging configuration (dashboard.web.server).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re

TEXT_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
FORMAT_ENV = "PROMESA_LOG_FORMAT"
FORMATS = ("text", "json")

# Public ids are a prefix that says what the thing is and a ULID (dashboard.core.ids).
_PUBLIC_ID = re.compile(r"\b(evt|dlv|sub|inc|rpl|snk|chk)_[0-9A-HJKMNP-TV-Z]{26}\b")
_ID_NAMES = {"evt": "event_id", "dlv": "delivery_id", "sub": "subscription_id", "inc": "incident_id",
             "rpl": "replay_id", "snk": "sink_id", "chk": "check_id"}
# What every LogRecord has: anything else on a record came from `extra=`.
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonLines(logging.Formatter):
    """A record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line = {"time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds")
                .replace("+00:00", "Z"), "level": record.levelname, "logger": record.name,
                "process": record.process, "message": message}
        for match in _PUBLIC_ID.finditer(message):
            line.setdefault(_ID_NAMES[match.group(1)], match.group(0))
        for name, value in vars(record).items():
            if name not in _RECORD_FIELDS and name.endswith("_id") and value is not None:
                line[name] = value if isinstance(value, (str, int)) else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)


def chosen(env=None) -> str:
    """The format PROMESA_LOG_FORMAT asks for; a value it cannot be stops the process with the choices."""
    value = ((env if env is not None else os.environ).get(FORMAT_ENV) or "text").strip().lower()
    if value not in FORMATS:
        raise SystemExit(f"{FORMAT_ENV}={value!r}: it is text (the default) or json")
    return value


def configure(env=None) -> None:
    """The root logger of a CLI process: INFO and above to stderr, in the chosen format."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if chosen(env) == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def gunicorn_logconfig(env=None) -> dict:
    """gunicorn's `logconfig_dict` for the chosen format: empty (gunicorn's own text lines) or JSON lines for its
    error and access logs and for the app's own loggers."""
    if chosen(env) != "json":
        return {}
    return {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"json": {"()": "dashboard.core.logs.JsonLines"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"},
                     "stdout": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"}},
        "root": {"level": "INFO", "handlers": ["stderr"]},
        "loggers": {"gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
                    "gunicorn.access": {"level": "INFO", "handlers": ["stdout"], "propagate": False}},
    }
