"""What an operator runs: `promesa status`, `promesa keys generate`, the refusal to start an installed
Promesa on PostgreSQL without its keys, with keys anyone could guess, or behind a proxy without a
metrics token, `promesa web --access-log/--no-access-log`, and where the instance folder is when
nothing says."""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request

import click
import click.testing
import pytest
import redis
from cryptography.fernet import Fernet

from dashboard.app import BASE_URL_SAID, create_app
from dashboard.cli import cli, refuse_unreadable_redis_url, refuse_unsafe_keys
from dashboard.core import config as config_module
from dashboard.queue import heartbeat

on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
POSTGRES = "postgresql://promesa@db.internal/promesa"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


@pytest.fixture
def execs(monkeypatch):
    """`promesa web` execs gunicorn: record the command line instead."""
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append(argv))
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append(argv))
    return calls


# -- status --------------------------------------------------------------------------------------
@on_sqlite
def test_status_lists_the_checks_and_the_live_workers(runner, config):
    conn = redis.Redis.from_url(config["REDIS_URL"])
    heartbeat.beat(conn, config["PROMESA_REDIS_PREFIX"], "worker", "box:11", {"database": "ok", "redis": "ok"})
    heartbeat.beat(conn, config["PROMESA_REDIS_PREFIX"], "sweeper", "box:12", {"last_pass": None})
    result = runner.invoke(cli, ["status"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "database    ok" and lines[2] == "migrations  at head"
    assert re.fullmatch(r"redis       ok \((127\.0\.0\.1:\d+|unix socket /\S+)\)", lines[1]), lines[1]  # which Redis
    assert "workers     1 live" in lines and "sweepers    1 live" in lines
    (worker,) = [line for line in lines if line.strip().startswith("box:11")]
    ago = re.search(r"last beat (\d+) s ago  database ok  redis ok", worker)
    assert ago and int(ago.group(1)) < 10, worker  # beaten just now (a loaded machine takes a moment)
    assert lines[-1] == "ready"


@on_sqlite
def test_status_says_what_is_missing_and_fails(config):
    port = free_port()
    app = create_app({**config, "REDIS_URL": f"redis://:s3cret-pw@127.0.0.1:{port}/0"})
    result = app.test_cli_runner().invoke(cli, ["status"])
    assert result.exit_code == 1
    assert f"redis       unreachable (127.0.0.1:{port})" in result.output and "not ready: redis" in result.output
    assert "s3cret-pw" not in result.output


@on_sqlite
@pytest.mark.parametrize("command", ["web", "worker", "sweep", "up", "status"])
def test_a_redis_url_that_cannot_be_read_stops_the_command_at_once(command, runner, execs):
    result = runner.invoke(cli, [command], env={"REDIS_URL": "redis+sentinel://:s3cret-pw@10.0.0.1:26379/"})
    assert result.exit_code == 2
    assert "REDIS_URL names no Sentinel service: the form is redis+sentinel://host:port[,host:port]/service_name[/db]" \
        in result.output and "s3cret-pw" not in result.output
    assert execs == []
    refuse_unreadable_redis_url(command, env={"REDIS_URL": "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster"})
    refuse_unreadable_redis_url(command, ["--help"], env={"REDIS_URL": "redis+sentinel://10.0.0.1:26379/"})
    refuse_unreadable_redis_url("users", env={"REDIS_URL": "redis+sentinel://10.0.0.1:26379/"})  # needs no Redis


@on_sqlite
def test_a_stopped_worker_leaves_the_list_at_once(config):
    import threading

    conn = redis.Redis.from_url(config["REDIS_URL"])
    prefix = config["PROMESA_REDIS_PREFIX"]
    stop = threading.Event()
    thread = heartbeat.start(conn, prefix, "worker", stop, lambda: {"database": "ok"})
    deadline = time.monotonic() + 5
    while not heartbeat.live(conn, prefix) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [b["name"] for b in heartbeat.live(conn, prefix)] == [heartbeat.process_name()]
    stop.set()
    thread.join(5)
    assert heartbeat.live(conn, prefix) == []


# -- keys ----------------------------------------------------------------------------------------
@on_sqlite
def test_keys_generate_prints_two_fresh_keys_and_logs_neither(runner, caplog):
    caplog.set_level(logging.DEBUG)
    first = runner.invoke(cli, ["keys", "generate"])
    second = runner.invoke(cli, ["keys", "generate"])
    assert first.exit_code == 0, first.output
    values = dict(line.split("=", 1) for line in first.stdout.splitlines())
    assert set(values) == {"SECRET_KEY", "PROMESA_ENCRYPTION_KEY", "PROMESA_METRICS_TOKEN"}
    assert len(bytes.fromhex(values["SECRET_KEY"])) == 32 and len(bytes.fromhex(values["PROMESA_METRICS_TOKEN"])) == 32
    assert Fernet(values["PROMESA_ENCRYPTION_KEY"]).decrypt(Fernet(values["PROMESA_ENCRYPTION_KEY"]).encrypt(b"x")) == b"x"
    assert first.stdout != second.stdout
    assert not any(v in caplog.text for v in values.values())


# -- the refusal ---------------------------------------------------------------------------------
def good_keys() -> dict:
    return {"SECRET_KEY": secrets.token_hex(32), "PROMESA_ENCRYPTION_KEY": Fernet.generate_key().decode()}


@pytest.mark.parametrize("command", ["web", "worker", "sweep", "up"])
def test_on_postgres_the_serving_commands_refuse_to_start_without_their_keys(command):
    with pytest.raises(click.UsageError, match="promesa keys generate") as refused:
        refuse_unsafe_keys(command, env={"DATABASE_URL": POSTGRES, "SECRET_KEY": good_keys()["SECRET_KEY"]})
    assert "PROMESA_ENCRYPTION_KEY is not set" in refused.value.message
    refuse_unsafe_keys(command, env={"DATABASE_URL": POSTGRES, **good_keys()})
    refuse_unsafe_keys(command, env={"DATABASE_URL": "sqlite:///here.db"})  # one laptop: kept keys are fine
    refuse_unsafe_keys(command, ["--help"], env={"DATABASE_URL": POSTGRES})  # asking how is not starting
    refuse_unsafe_keys("status", env={"DATABASE_URL": POSTGRES})  # only serving commands need them


@pytest.mark.parametrize("name, value, words", [
    ("SECRET_KEY", "CHANGE-ME", "SECRET_KEY is a placeholder"),
    ("SECRET_KEY", "change_me_to_something_long_and_random_0123456789", "SECRET_KEY is a placeholder"),
    ("SECRET_KEY", "s3cr3t-k3y", "SECRET_KEY is 10 characters long"),
    ("SECRET_KEY", "a" * 64, "SECRET_KEY has too little randomness"),
    ("SECRET_KEY", "0123456789" * 4, "SECRET_KEY has too little randomness"),
    ("PROMESA_ENCRYPTION_KEY", "CHANGE-ME", "PROMESA_ENCRYPTION_KEY is a placeholder"),
    ("PROMESA_ENCRYPTION_KEY", "not-a-fernet-key-but-long-enough-to-pass-0123", "PROMESA_ENCRYPTION_KEY is not a Fernet key"),
    ("PROMESA_ENCRYPTION_KEY", "A" * 43 + "=", "PROMESA_ENCRYPTION_KEY has too little randomness"),
    ("PROMESA_METRICS_TOKEN", "CHANGE-ME", "PROMESA_METRICS_TOKEN is a placeholder"),
    ("PROMESA_METRICS_TOKEN", "token123", "PROMESA_METRICS_TOKEN is 8 characters long"),
])
@pytest.mark.parametrize("database", [POSTGRES, "sqlite:///here.db"])
def test_a_key_anyone_could_guess_is_refused_whatever_the_database(name, value, words, database):
    env = {"DATABASE_URL": database, **good_keys(), name: value}
    for command in ("web", "worker", "sweep", "up"):
        with pytest.raises(click.UsageError, match="promesa keys generate") as refused:
            refuse_unsafe_keys(command, env=env)
        assert words in refused.value.message
        assert value not in refused.value.message  # the key itself is never repeated


def test_keys_made_by_keys_generate_are_accepted(runner):
    made = runner.invoke(cli, ["keys", "generate"])
    env = dict(line.split("=", 1) for line in made.stdout.splitlines())
    refuse_unsafe_keys("web", env={"DATABASE_URL": POSTGRES, "PROMESA_TRUSTED_PROXIES": "1", **env})


@pytest.mark.parametrize("command, refused", [("web", True), ("up", True), ("worker", False), ("sweep", False)])
def test_behind_a_trusted_proxy_the_web_does_not_start_without_a_metrics_token(command, refused):
    env = {"DATABASE_URL": POSTGRES, "PROMESA_TRUSTED_PROXIES": "1", **good_keys()}
    if refused:
        with pytest.raises(click.UsageError, match="PROMESA_METRICS_TOKEN is not") as refusal:
            refuse_unsafe_keys(command, env=env)
        assert "promesa keys generate" in refusal.value.message
    else:
        refuse_unsafe_keys(command, env=env)
    refuse_unsafe_keys(command, env={**env, "PROMESA_METRICS_TOKEN": secrets.token_hex(32)})
    refuse_unsafe_keys(command, env={**env, "PROMESA_TRUSTED_PROXIES": "0"})


@on_sqlite
def test_promesa_web_with_the_placeholder_key_does_not_start(runner, execs, tmp_path):
    result = runner.invoke(cli, ["web"], env={"DATABASE_URL": POSTGRES, **good_keys(), "SECRET_KEY": "CHANGE-ME",
                                             "PROMESA_INSTANCE_PATH": str(tmp_path / "fresh")})
    assert result.exit_code == 2
    assert "SECRET_KEY is a placeholder" in result.output and "promesa keys generate" in result.output
    assert execs == []


@on_sqlite
def test_the_embedded_default_still_starts_with_its_generated_keys(runner, execs, tmp_path):
    result = runner.invoke(cli, ["web"], env={"DATABASE_URL": None, "SECRET_KEY": None, "PROMESA_ENCRYPTION_KEY": None,
                                             "PROMESA_METRICS_TOKEN": None, "PROMESA_TRUSTED_PROXIES": None,
                                             "PROMESA_INSTANCE_PATH": str(tmp_path / "fresh")})
    assert result.exit_code == 0, result.output
    assert len(execs) == 1


def test_promesa_home_holds_the_instance_wherever_the_command_runs(tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    env = {"DATABASE_URL": None, "SECRET_KEY": None, "PROMESA_ENCRYPTION_KEY": None, "PROMESA_METRICS_TOKEN": None,
           "PROMESA_TRUSTED_PROXIES": None, "PROMESA_INSTANCE_PATH": None, "PROMESA_HOME": str(home)}
    result = click.testing.CliRunner().invoke(cli, ["db", "upgrade"], env=env)  # its own app, not the test's
    assert result.exit_code == 0, result.output
    assert {path.name for path in home.iterdir()} >= {"promesa.db", "secret_key", "encryption_key"}
    assert list(elsewhere.iterdir()) == []  # nothing in the current directory
    assert config_module.instance_folder({}) == str(elsewhere / "instance")  # unset: the current directory's
    assert config_module.instance_folder({"PROMESA_INSTANCE_PATH": str(home)}) == str(home)  # 0.1's name


def test_promesa_home_and_its_old_name_naming_two_folders_is_refused(execs, tmp_path):
    result = click.testing.CliRunner().invoke(cli, ["web"], env={"DATABASE_URL": None,
                                                                 "PROMESA_HOME": str(tmp_path / "a"),
                                                                 "PROMESA_INSTANCE_PATH": str(tmp_path / "b")})
    assert result.exit_code == 2
    assert "name different instance folders: set PROMESA_HOME only" in result.output
    assert execs == [] and not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@on_sqlite
def test_the_refusal_stops_the_command_before_it_starts(runner, execs, tmp_path):
    result = runner.invoke(cli, ["web"], env={"DATABASE_URL": POSTGRES, "SECRET_KEY": None,
                                             "PROMESA_ENCRYPTION_KEY": None,
                                             "PROMESA_INSTANCE_PATH": str(tmp_path / "fresh")})
    assert result.exit_code == 2
    assert "SECRET_KEY and PROMESA_ENCRYPTION_KEY are not set" in result.output
    assert execs == []
    assert not (tmp_path / "fresh").exists()  # and no key was generated on the way
    asked = runner.invoke(cli, ["web", "--help"], env={"DATABASE_URL": POSTGRES, "SECRET_KEY": None,
                                                      "PROMESA_ENCRYPTION_KEY": None})
    assert asked.exit_code == 0 and "--no-access-log" in asked.output  # asking how is not starting


@on_sqlite
def test_web_makes_the_address_it_serves_the_default_base_url_and_says_it_is_unset_once(runner, monkeypatch, caplog):
    started = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.append(env))
    monkeypatch.setattr(os, "execv", lambda path, argv: started.append(dict(os.environ)))  # never gunicorn in here
    with caplog.at_level(logging.WARNING, logger="dashboard.app"):
        result = runner.invoke(cli, ["web", "--port", "5101"], env={"PROMESA_BASE_URL": None, BASE_URL_SAID: None})
    assert result.exit_code == 0, result.output
    (env,) = started  # gunicorn's, whose workers make their apps with it and stay quiet
    assert env[config_module.SERVED_URL] == "http://127.0.0.1:5101" and env[BASE_URL_SAID] == "1"
    said = [record.getMessage() for record in caplog.records if "PROMESA_BASE_URL" in record.getMessage()]
    assert len(said) == 1 and "point at http://127.0.0.1:5101 " in said[0]


# -- the access log ------------------------------------------------------------------------------
@on_sqlite
@pytest.mark.parametrize("args, env, logged", [
    ([], {}, True),
    (["--no-access-log"], {}, False),
    ([], {"PROMESA_ACCESS_LOG": "0"}, False),
    ([], {"PROMESA_ACCESS_LOG": "false"}, False),
    (["--access-log"], {"PROMESA_ACCESS_LOG": "0"}, True),
])
def test_web_access_log_flag_and_environment(runner, execs, args, env, logged):
    result = runner.invoke(cli, ["web", *args], env={"PROMESA_ACCESS_LOG": None, **env})
    assert result.exit_code == 0, result.output
    (argv,) = execs
    assert ("--access-logfile" in argv) is logged


@on_sqlite
def test_gunicorn_writes_access_lines_only_when_asked(tmp_path, config):
    def served_lines(flag: str) -> str:
        port = free_port()
        env = dict(os.environ, DATABASE_URL=config["SQLALCHEMY_DATABASE_URI"], REDIS_URL=config["REDIS_URL"],
                   PROMESA_INSTANCE_PATH=str(tmp_path / "instance"))
        process = subprocess.Popen([sys.executable, "-m", "dashboard.cli", "web", "--port", str(port), "--workers",
                                    "1", flag], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?probe=1", timeout=2) as resp:
                        assert resp.status == 200
                        break
                except OSError:
                    assert time.monotonic() < deadline and process.poll() is None
                    time.sleep(0.1)
        finally:
            process.terminate()
            out, _ = process.communicate(timeout=30)
        return out

    assert "GET /healthz?probe=1" in served_lines("--access-log")
    assert "GET /healthz" not in served_lines("--no-access-log")


# -- the instance folder -------------------------------------------------------------------------
def test_the_instance_folder_defaults_to_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROMESA_INSTANCE_PATH", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    app = create_app({"TESTING": True, "REDIS_URL": "redis://unused"})
    assert app.instance_path == str(tmp_path / "instance")
    assert (tmp_path / "instance" / "secret_key").exists()
