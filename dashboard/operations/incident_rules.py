"""The rules an incident opens on: their defaults, each subscription's overrides, and how they read."""

from __future__ import annotations

from dataclasses import dataclass, replace

from flask import current_app
from sqlalchemy import select

from dashboard import audit
from dashboard.core.extensions import db
from dashboard.models import Incident, IncidentRule, Subscription
from dashboard.stats import folding
from dashboard.subscriptions import client_tls


@dataclass(frozen=True)
class Setting:
    rule: str
    enabled: bool
    threshold: float | None
    window_minutes: int
    min_attempts: int | None

    def describe(self) -> str:
        if self.rule == "dead_letters":
            return f"at least {self.threshold:g} dead letters in {self.window_minutes} min"
        if self.rule == "failure_rate":
            return (f"at least {self.threshold:g} % of attempts failed over {self.window_minutes} min, "
                    f"with at least {self.min_attempts} attempts")
        if self.rule == "failing_since":
            return f"no success for {self.window_minutes} min while attempts keep failing"
        if self.rule == CERTIFICATE_EXPIRING.rule:
            return f"its client certificate expires within {self.threshold:g} days (or has expired)"
        return f"the oldest due delivery has waited more than {self.window_minutes} min"


# The rules a subscription can tune, with their defaults; `backlog` is Promesa's own (PROMESA_BACKLOG_ALERT_MINUTES).
DEFAULTS = {
    "dead_letters": Setting("dead_letters", True, 5, 15, None),
    "failure_rate": Setting("failure_rate", True, 50, 15, 20),
    "failing_since": Setting("failing_since", True, None, 60, None),
}
# Fixed, as backlog is: from client_tls.EXPIRY_WARNING before a subscription's client certificate ends until it is
# replaced (the window: it resolves at the first check that finds it replaced).
CERTIFICATE_EXPIRING = Setting("certificate_expiring", True, client_tls.EXPIRY_WARNING.days, 1, None)
TITLES = {"dead_letters": "Dead letters piling up", "failure_rate": "High failure rate",
          "failing_since": "No success for a while", "backlog": "Delivery backlog",
          "certificate_expiring": "Client certificate expiring"}


def title(rule: str) -> str:
    """A rule's title in words; an unknown rule (one no longer defined) by its name."""
    return TITLES.get(rule, rule)

# What a setting may be: (lowest, highest) for threshold, window and minimum attempts, per rule.
LIMITS = {
    "dead_letters": {"threshold": (1, 1_000_000), "window_minutes": (1, 1440)},
    "failure_rate": {"threshold": (1, 100), "window_minutes": (1, 1440), "min_attempts": (1, 1_000_000)},
    "failing_since": {"window_minutes": (5, 10080)},
}


def backlog_setting() -> Setting:
    return Setting("backlog", True, None, int(current_app.config["PROMESA_BACKLOG_ALERT_MINUTES"]), None)


def settings_for(subscription_ids) -> dict[str, dict[str, Setting]]:
    """Each subscription's effective rules: the defaults, with its own overrides applied."""
    out = {sub: dict(DEFAULTS) for sub in subscription_ids}
    for ids in folding.chunks(list(out)):
        for row in db.session.scalars(select(IncidentRule).where(IncidentRule.subscription_id.in_(ids))):
            default = DEFAULTS.get(row.rule)
            if default is None:
                continue
            out[row.subscription_id][row.rule] = replace(
                default, enabled=row.enabled,
                threshold=row.threshold if row.threshold is not None else default.threshold,
                window_minutes=row.window_minutes or default.window_minutes,
                min_attempts=row.min_attempts or default.min_attempts)
    return out


def setting_of(incident: Incident) -> Setting:
    if incident.rule == "backlog":
        return backlog_setting()
    if incident.rule == CERTIFICATE_EXPIRING.rule:
        return CERTIFICATE_EXPIRING
    return settings_for([incident.subscription_id])[incident.subscription_id][incident.rule]


def save_rule(sub: Subscription, rule: str, form, actor: str) -> Setting:
    """Validate a rule form (enabled, threshold, window_minutes, min_attempts) and store it;
    raises ValueError saying what is wrong, and stores nothing then."""
    if rule not in DEFAULTS:
        raise ValueError(f"unknown rule {rule!r}; the rules are {', '.join(DEFAULTS)}")
    values = {}
    for field, (low, high) in LIMITS[rule].items():
        raw = (form.get(field) or "").strip()
        if not raw:
            values[field] = None  # the default
            continue
        try:
            number = float(raw) if field == "threshold" else int(raw)
        except ValueError:
            raise ValueError(f"{field.replace('_', ' ')} must be a number from {low} to {high}") from None
        if not low <= number <= high:
            raise ValueError(f"{field.replace('_', ' ')} must be from {low} to {high}")
        values[field] = number
    row = db.session.get(IncidentRule, (sub.id, rule)) or IncidentRule(subscription_id=sub.id, rule=rule)
    row.enabled = form.get("enabled") == "on"
    row.threshold, row.window_minutes, row.min_attempts = (values.get(k) for k in ("threshold", "window_minutes",
                                                                                   "min_attempts"))
    row.updated_at = current_app.config["CLOCK"].now()
    row.updated_by = actor
    db.session.add(row)
    audit.record("incident_rule.changed", subscription=sub, target=f"rule:{rule}",
                 detail={"enabled": row.enabled, **{k: v for k, v in values.items() if v is not None}})
    db.session.commit()
    return settings_for([sub.id])[sub.id][rule]
