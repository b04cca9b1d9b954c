"""deploy/: the Prometheus rules and the Grafana dashboard name only series a real /metrics serves, their
links open the on-call pages, and the systemd units start commands that exist with flags they accept,
in the environment the example file gives."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import click
import click.testing
import pytest
import yaml

from dashboard.core import config as config_module
from dashboard.app import create_app
from dashboard.cli import cli
from dashboard.operations.sweeper import sweep_once

from ..support.pipeline import deliver_due
from tests.web.test_metrics import scrape

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "promesa.json"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
ENV_FILE = DEPLOY / "systemd" / "promesa.env"
BASE_URL = "https://promesa.example.com"  # stands for PROMESA_BASE_URL in every link (docs/deploying.md)
TARGET_LABELS = {"job", "instance"}  # Prometheus adds them to every scraped series

# --- a small PromQL reading: which series an expression selects, with which labels ---------------------

STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
TOKENS = re.compile(r"\{[^}]*\}|(?<![\w:.])[A-Za-z_:][\w:]*")
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "start", "end"}
AGGREGATIONS = re.compile(r"\b(sum|avg|min|max|count|stddev|stdvar|topk|bottomk|quantile|count_values|group|"
                          r"histogram_quantile)\s*(\(|by\b|without\b)")


def _stripped(expr: str) -> str:
    """The expression without string literals and Grafana variables, which hold no series names."""
    return re.sub(r"\$\{[^}]*\}|\$\w+", "0", STRINGS.sub('""', expr))


def selectors(expr: str) -> dict[str, set[str]]:
    """Every series name in `expr`, with the label names its matchers use."""
    s = _stripped(expr)
    s = LABEL_LISTS.sub(" ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries: durations only
    found: dict[str, set[str]] = {}
    name = None  # the series the next {…} belongs to
    for match in TOKENS.finditer(s):
        token = match.group()
        if token.startswith("{"):
            labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", token))
            if name is not None:
                found[name] |= labels
            elif labels:
                found.setdefault("", set()).update(labels)  # a selector with no name: reported
            name = None
            continue
        name = None
        if s[match.end():].lstrip().startswith("(") or token.lower() in KEYWORDS:
            continue  # a function or an aggregation, or an operator
        name = token
        found.setdefault(name, set())
    # A bare {…} selector names its series in __name__, which this reading does not follow.
    assert "" not in found and "__name__" not in s, f"only selectors that start with a name are checked: {expr}"
    return found


def kept_labels(expr: str, served: dict[str, set[str]]) -> set[str]:
    """The labels the expression's result keeps: those of an aggregation's `by`, else its series'."""
    s = _stripped(expr)
    if AGGREGATIONS.search(s):
        lists = [set(re.findall(r"\w+", labels)) for kind, labels in LABEL_LISTS.findall(s) if kind == "by"]
        kept = set.intersection(*lists) if lists else set()
        return kept - {"le"} if "histogram_quantile" in s else kept
    return set().union(*(served.get(name, set()) for name in selectors(expr))) | TARGET_LABELS


def unserved(expr: str, served: dict[str, set[str]]) -> list[str]:
    """What `expr` names that /metrics does not serve: series, or labels those series do not carry."""
    problems = []
    for name, labels in selectors(expr).items():
        if name not in served:
            problems.append(f"series {name}")
        elif missing := labels - served[name] - TARGET_LABELS:
            problems.append(f"labels {sorted(missing)} of {name}")
    return problems


def test_the_reading_finds_series_and_nothing_else():
    assert selectors('histogram_quantile(0.95, sum by (le) (rate(promesa_attempt_duration_seconds_bucket[10m]))) > 5') \
        == {"promesa_attempt_duration_seconds_bucket": set()}
    assert selectors('sum without (team) (rate(a_total{outcome="failed", x=~"a}b"}[$__rate_interval] offset 5m)) '
                     '/ ignoring(outcome) group_left(team) b:recorded * on (sub) c > bool 1e3 and d') \
        == {"a_total": {"outcome", "x"}, "b:recorded": set(), "c": set(), "d": set()}
    assert selectors('label_replace(up, "dst", "$1", "src", "(.*)") or vector(0)') == {"up": set()}
    assert selectors("max_over_time(x[1h:5m]) unless y") == {"x": set(), "y": set()}
    assert kept_labels('sum by (subscription, le) (rate(x[5m]))', {}) == {"subscription", "le"}
    assert kept_labels('histogram_quantile(0.5, sum by (le) (rate(x[5m])))', {}) == set()
    assert kept_labels('x > 1', {"x": {"rule"}}) == {"rule"} | TARGET_LABELS


def test_the_check_reports_what_is_not_served():
    served = {"promesa_attempts_total": {"subscription", "team", "outcome"}}
    assert unserved('rate(promesa_attempts_total{outcome="failed"}[5m])', served) == []
    assert unserved('rate(promesa_attempts_total{reason="x"}[5m]) + promesa_nope_total', served) == \
        ["labels ['reason'] of promesa_attempts_total", "series promesa_nope_total"]


# --- the files -------------------------------------------------------------------------------------------

def alert_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_exprs() -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable, expression, label) of each `label_values(expr, label)` variable."""
    out = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert match, f"variable {var['name']}: only label_values(series, label) is checked: {query}"
            out.append((var["name"], match.group(1), match.group(2)))
    return out


def test_the_rules_carry_annotations_and_links():
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {"PromesaIncident", "PromesaBacklog", "PromesaDeadLetters"}
    for rule in rules:
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], rule["alert"]
        path = notes["promesa_path"]
        assert path.startswith("/") and notes["runbook_url"] == BASE_URL + path, rule["alert"]
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"(\d+[smhdwy])+", rule["for"]), rule["alert"]
        for text in notes.values():
            assert text.count("{{") == text.count("}}"), (rule["alert"], text)


def test_the_dashboard_reads_one_prometheus_chosen_by_a_variable():
    dash = dashboard()
    [source] = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    ref = {"type": "prometheus", "uid": "${" + source["name"] + "}"}
    ids = [panel["id"] for panel in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = [(x, y) for panel in dash["panels"] for pos in [panel["gridPos"]]
             for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])]
    assert len(cells) == len(set(cells)) and all(x < 24 for x, _ in cells), "panels overlap or leave the grid"
    for panel in dash["panels"]:
        assert panel["datasource"] == ref and panel["targets"], panel["title"]
        assert all(target["datasource"] == ref for target in panel["targets"]), panel["title"]
    # What the issue asks it to show: outcomes, the latency quantiles, backlog, dead letters, incidents, replays.
    used = set().union(*(selectors(expr) for _, expr in panel_exprs()))
    assert {"promesa_attempts_total", "promesa_attempt_duration_seconds_bucket", "promesa_due_deliveries",
            "promesa_due_oldest_age_seconds", "promesa_dead_lettered_total", "promesa_dead_letters_waiting",
            "promesa_unresolved_incidents", "promesa_incident_open", "promesa_replays_running"} <= used
    quantiles = {m for _, expr in panel_exprs() for m in re.findall(r"histogram_quantile\(([\d.]+)", expr)}
    assert quantiles == {"0.5", "0.95", "0.99"}


@pytest.fixture
def served(app, client, producer, receiver, clock):
    """A real /metrics after deliveries that succeeded, failed and were dead-lettered, an open incident
    and folded latencies: {series: label names}, and the samples themselves."""
    for event_type, path in (("file.updated", "/ok"), ("file.deleted", "/status/400")):
        broken = producer.subscribe(receiver.url + path, event_types=[event_type])
        for _ in range(5):
            producer.publish(event_type)
    # Each delivery to the broken receiver runs out of tries; the sweeper then opens a dead_letters
    # incident, and folds the latencies a pass behind.
    for minutes in (2, 2, 2, 5, 5, 5):
        deliver_due(app, clock)
        clock.advance(minutes=minutes)
        sweep_once(app)
    samples = scrape(client)
    series: dict[str, set[str]] = {}
    for name, labels in samples:
        series.setdefault(name, set()).update(label for label, _ in labels)
    assert any(dict(labels).get("subscription") == broken["id"] for name, labels in samples
               if name == "promesa_incident_open"), "the scenario must open an incident"
    assert samples[("promesa_attempt_duration_seconds_count", ())] == 20, "and fold every attempt's latency"
    return series, samples


def test_every_series_the_rules_and_the_dashboard_name_is_served(served):
    series, _ = served
    problems = []
    for rule in alert_rules():
        problems += [f"rule {rule['alert']}: {p}" for p in unserved(rule["expr"], series)]
        kept = kept_labels(rule["expr"], series)
        for text in rule["annotations"].values():
            problems += [f"rule {rule['alert']}: $labels.{label} is not in its result"
                         for label in re.findall(r"\$labels\.(\w+)", text) if label not in kept]
    for title, expr in panel_exprs():
        problems += [f"panel {title!r}: {p}" for p in unserved(expr, series)]
    for name, expr, label in variable_queries():
        problems += [f"variable {name}: {p}" for p in unserved(expr, series)]
        problems += [f"variable {name}: no label {label}" for s in selectors(expr) if label not in series.get(s, ())]
    assert problems == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_links_open_the_on_call_pages(served, client, users, auth):
    _, samples = served
    auth.login("oncall")
    incident = next(dict(labels) for name, labels in samples if name == "promesa_incident_open")
    dead = next(dict(labels) for (name, labels), value in samples.items()
                if name == "promesa_dead_lettered_total" and value > 0)
    labels_of = {"PromesaIncident": incident, "PromesaDeadLetters": dead}
    for rule in alert_rules():
        labels = labels_of.get(rule["alert"], {})
        path = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m, labels=labels: labels[m.group(1)],
                      rule["annotations"]["promesa_path"])
        assert "{{" not in path
        page = client.get(path)
        assert page.status_code == 200, (rule["alert"], path, page.status_code)
        if labels:  # the page is the one the alert is about
            assert labels.get("incident_id", labels.get("subscription")) in page.get_data(as_text=True)
    # The dashboard's incident table links each row to its page.
    links = [link["url"] for panel in dashboard()["panels"]
             for link in panel["fieldConfig"]["defaults"].get("links", [])]
    assert links == ["${promesa_url}/incidents/${__data.fields.incident_id}"]
    assert client.get(links[0].replace("${promesa_url}", "").replace(
        "${__data.fields.incident_id}", incident["incident_id"])).status_code == 200


def test_promtool_accepts_the_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package provides it)")
    result = subprocess.run([promtool, "check", "rules", str(RULES)], check=False, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- systemd ---------------------------------------------------------------------------------------------

def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def environment_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if line and not line.startswith("#"))
    return {name: value for name, value in pairs}


def parse_command(argv: list[str]) -> tuple[str, dict]:
    """Parse `promesa ARGV` as the CLI would, without running it: the command path and its parameters."""
    def rest(ctx):
        with warnings.catch_warnings():  # click 8.2 keeps the subcommand in protected_args, 9 in args
            warnings.simplefilter("ignore", DeprecationWarning)
            return [*getattr(ctx, "protected_args", []), *ctx.args]

    ctx, command = cli.make_context("promesa", list(argv)), cli
    with ctx:
        while isinstance(command, click.Group):
            name, command, args = command.resolve_command(ctx, rest(ctx))
            ctx = command.make_context(name, args, parent=ctx)
        assert not rest(ctx), f"promesa {' '.join(argv)}: arguments left over: {rest(ctx)}"
        return ctx.command_path, ctx.params


def test_the_command_parser_refuses_what_the_cli_refuses():
    assert parse_command(["web", "--port", "5001"]) == ("promesa web", {"host": "127.0.0.1", "port": 5001,
                                                                         "workers": 2, "access_log": True})
    for wrong in (["sweeper"], ["web", "--port", "x"], ["worker", "--bogus"]):
        with pytest.raises(click.UsageError):
            parse_command(wrong)


def test_there_are_units_for_web_workers_and_the_sweeper():
    starts = {shlex.split(unit(path)["Service"]["ExecStart"])[1] for path in UNITS}
    assert {"web", "worker", "sweep"} <= starts
    assert any(path.name.endswith("@.service") for path in UNITS if "worker" in path.name)


@pytest.mark.parametrize("path", UNITS, ids=[p.name for p in UNITS])
def test_each_unit_starts_a_promesa_command_with_flags_it_accepts(path, tmp_path):
    service = unit(path)["Service"]
    argv = shlex.split(service["ExecStart"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert Path(argv[0]).name in scripts, argv[0]  # the console script `pip install` makes
    command, _ = parse_command(argv[1:])
    assert command.startswith("promesa ")
    # The installed entry point answers for the same command.
    result = subprocess.run([sys.executable, "-m", "dashboard.cli", *command.split()[1:], "--help"],
                            check=False, capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env=dict(os.environ, PROMESA_HOME=str(tmp_path / "instance")))
    assert result.returncode == 0, result.stderr
    assert f"Usage: promesa {command.split(' ', 1)[1]}" in result.stdout


@pytest.mark.parametrize("path", UNITS, ids=[p.name for p in UNITS])
def test_each_unit_runs_unprivileged_where_its_instance_folder_is_writable(path):
    service = unit(path)["Service"]
    instance = environment_example()["PROMESA_HOME"]
    assert service["EnvironmentFile"] == "/etc/promesa/promesa.env"
    assert service["User"] not in {"", "root"}
    assert "/var/lib/" + service["StateDirectory"] == instance == service["WorkingDirectory"]
    if service.get("ProtectSystem") == "strict":
        assert instance in service["ReadWritePaths"].split()


def test_the_environment_example_sets_what_promesa_reads(monkeypatch, tmp_path):
    example = environment_example()
    required = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "PROMESA_ENCRYPTION_KEY", "PROMESA_HOME"}
    assert required <= set(example)
    for name in [n for n in os.environ if n.startswith("PROMESA_") or n in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"}]:
        monkeypatch.delenv(name)
    for name, value in example.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PROMESA_HOME", str(tmp_path / "instance"))  # the example's is not writable here
    app = create_app()  # builds the engine without connecting: the example's hosts need not exist
    expected = {"SQLALCHEMY_DATABASE_URI": config_module.normalize_database_url(example["DATABASE_URL"]),
                "REDIS_URL": example["REDIS_URL"], "SECRET_KEY": example["SECRET_KEY"],
                "PROMESA_ENCRYPTION_KEY": example["PROMESA_ENCRYPTION_KEY"]}
    for name, value in example.items():
        if name.startswith("PROMESA_") and name in config_module.DEFAULTS:
            expected[name] = config_module.overrides_from_environment({name: config_module.DEFAULTS[name]})[name]
    expected["PROMESA_ALLOW_PRIVATE_TARGETS"] = False
    assert {name: app.config[name] for name in expected} == expected
    assert app.instance_path == str(tmp_path / "instance")
    read_elsewhere = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "PROMESA_ENCRYPTION_KEY", "PROMESA_HOME",
                      "PROMESA_ALLOW_PRIVATE_TARGETS"}
    assert set(example) - read_elsewhere - set(config_module.DEFAULTS) == set(), "a name Promesa does not read"


def test_the_unedited_environment_example_is_refused_and_says_how_to_fix_it(monkeypatch, tmp_path):
    execs = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: execs.append(argv))
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(argv))
    runner = click.testing.CliRunner()
    example = {**environment_example(), "PROMESA_HOME": str(tmp_path / "instance")}
    for command in ("web", "worker", "sweep"):
        result = runner.invoke(cli, [command], env=example)
        assert result.exit_code == 2, result.output
        for name in ("SECRET_KEY", "PROMESA_ENCRYPTION_KEY", "PROMESA_METRICS_TOKEN"):
            assert f"{name} is a placeholder" in result.output
        assert "promesa keys generate" in result.output
    assert execs == []
    made = runner.invoke(cli, ["keys", "generate"])
    filled = {**example, **dict(line.split("=", 1) for line in made.stdout.splitlines())}
    assert runner.invoke(cli, ["web"], env=filled).exit_code == 0 and len(execs) == 1


def test_systemd_accepts_the_units(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    script = Path(sys.executable).with_name("promesa")
    if not script.exists():
        pytest.skip(f"the promesa console script is not installed beside {sys.executable}")
    names = []
    for path in UNITS:  # the units as installed, pointing at this machine's promesa and the example environment
        text = path.read_text().replace("/opt/promesa/venv/bin/promesa", str(script)) \
            .replace("/etc/promesa/promesa.env", str(ENV_FILE))
        (tmp_path / path.name).write_text(text)
        names.append(path.name.replace("@.service", "@1.service"))
    result = subprocess.run([analyze, "verify", "--man=no", *names], check=False, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr
