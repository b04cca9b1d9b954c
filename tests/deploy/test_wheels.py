"""The wheels `make dist` builds (issue 41): built from a clean copy of the checkout and installed, not editable, into
a new virtualenv outside it, they run Promesa from an empty folder to a first signed delivery, carry every file the
server serves, and write nothing into the virtualenv: the instance folder is the current directory's, or
PROMESA_HOME. The server's wheel installs with pipx too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from dashboard.core.resources import RESOURCES

from ..support.process_groups import stop_group
from ..support.waiting import wait_until
from ..support.web_server import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The three distributions, as `make dist` builds them: the server, the receiver SDK, the producer client.
PROJECTS = (".", "sdk", "sdk/producer")


def tracked_copy(target: Path) -> list[str]:
    """The checkout's files as they are in the working tree, copied to `target`: what a clone would hold, with the
    work not yet committed (new files git does not ignore included), never the checkout's .venv, instance/, dist/
    or caches. Their paths."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    tracked = [path for path in listed.decode().split("\0") if path and (ROOT / path).is_file()]
    for path in tracked:
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, target / path)
    return tracked


def build(source: Path, dist: Path) -> None:
    """`make dist`'s builds, the three at once: each an sdist, then a wheel from that sdist."""
    builds = [subprocess.Popen([sys.executable, "-m", "build", "--quiet", "--outdir", str(dist), str(source / project)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for project in PROJECTS]
    for project, process in zip(PROJECTS, builds):
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, f"building {project} failed:\n{output.decode()[-3000:]}"


def install(wheels: list[Path], venv: Path, constraints: Path) -> None:
    """A new virtualenv with the wheels in it, not editable, pinned as docs/deploying.md installs them. It gets no
    pip of its own: this one installs into it (the dependencies come from pip's cache or its index)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                                "--quiet", "-c", str(constraints), *map(str, wheels)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]


def version_of(source: Path, project: str) -> tuple[str, str]:
    declared = tomllib.loads((source / project / "pyproject.toml").read_text())["project"]
    return declared["name"], declared["version"]


def files_of(venv: Path) -> dict[str, tuple[int, int]]:
    """Every file in the virtualenv, with its size and modification time."""
    return {str(path): (stat.st_size, stat.st_mtime_ns) for path in venv.rglob("*")
            if path.is_file() and not path.is_symlink() and (stat := path.stat())}


def test_the_wheels_run_promesa_from_an_empty_folder_to_a_signed_delivery(tmp_path, receiver):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the wheels are built from the checkout's tracked files, and this is not a git checkout")
    source, dist, venv, empty = (tmp_path / name for name in ("source", "dist", "venv", "empty"))
    tracked = tracked_copy(source)
    build(source, dist)

    # One sdist and one wheel per distribution, each at the version its own pyproject.toml names.
    versions = dict(version_of(source, project) for project in PROJECTS)
    built = sorted(path.name for path in dist.iterdir())
    assert built == sorted(f"{name.replace('-', '_')}-{version}{ending}" for name, version in versions.items()
                           for ending in ("-py3-none-any.whl", ".tar.gz")), built
    assert f"\n## {versions['promesa']}" in (source / "CHANGELOG.md").read_text(), "a release says what changed"

    # The server's wheel: every file of its packages, and its templates, static files and migrations inside them.
    carried = set(zipfile.ZipFile(dist / f"promesa-{versions['promesa']}-py3-none-any.whl").namelist())
    wanted = {path for path in tracked if path.startswith(("dashboard/", "promesa_bench/"))}
    wanted |= {f"dashboard/_resources/{path}" for path in tracked if path.split("/")[0] in RESOURCES}
    assert sorted(wanted - carried) == []
    assert {name.split("/")[0] for name in carried} == {"dashboard", "promesa_bench",
                                                        f"promesa-{versions['promesa']}.dist-info"}

    install(sorted(dist.glob("*.whl")), venv, source / "constraints.txt")
    python, promesa = venv / "bin" / "python", venv / "bin" / "promesa"
    before = files_of(venv)

    empty.mkdir()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PROMESA_", "PYTHON", "FLASK_")) and name not in ("DATABASE_URL", "REDIS_URL",
                                                                                   "VIRTUAL_ENV", "SECRET_KEY")}
    env.update(PROMESA_ALLOW_PRIVATE_TARGETS="1", PROMESA_ACCESS_LOG="0")

    def run(*argv, where: Path = empty, home: Path | None = None) -> str:
        done = subprocess.run(argv, cwd=where, env=dict(env, PROMESA_HOME=str(home)) if home else env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{argv[1:]} exited {done.returncode}:\n{done.stderr[-3000:]}"
        return done.stdout.strip()

    assert run(python, "-c", "import dashboard; print(dashboard.__file__)").startswith(str(venv))
    assert run(promesa, "--version") == f"promesa {versions['promesa']}"
    run(promesa, "db", "upgrade")
    token = run(promesa, "tokens", "create", "--team", "acme").splitlines()[-1]

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "up.log"
    with log.open("w") as out:  # REDIS_URL unset: up starts the embedded Redis, as on a trial machine
        up = subprocess.Popen([promesa, "up", "--port", str(port), "--workers", "1"], cwd=empty, env=env,
                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: up.poll() is not None or _status(f"{url}/readyz") == 200, timeout=90)
        assert up.poll() is None and _status(f"{url}/readyz") == 200, log.read_text()[-3000:]
        assert _status(f"{url}/login") == 200 and _status(f"{url}/static/promesa.css") == 200

        secret = _post_json(f"{url}/api/v1/subscriptions", token, {"url": receiver.url + "/ok"})["secret"]
        published = run(python, "-c", "import sys; from promesa_producer import Client; "
                        "print(Client(sys.argv[1], sys.argv[2]).publish('file.updated', {'resource_id': 'f_1'}).id)",
                        url, token)
        assert receiver.wait_for(1, timeout=60), log.read_text()[-3000:]
        got = receiver.requests[0]
        assert json.loads(got.body)["id"] == published
        verified = subprocess.run([python, "-c", "import sys; from promesa_receiver import verify; "
                                   "verify(sys.stdin.buffer.read(), sys.argv[1], sys.argv[2]); print('verified')",
                                   got.headers["X-Signature"], secret],
                                  input=got.body, capture_output=True, timeout=30)
        assert verified.stdout.strip() == b"verified", verified.stderr.decode()[-3000:]
    finally:
        stop_group(up, timeout=60)
    assert up.returncode == 0, log.read_text()[-3000:]

    assert (empty / "instance" / "promesa.db").is_file()
    after = files_of(venv)
    assert {path for path in after.keys() | before.keys() if after.get(path) != before.get(path)} == set()

    # The same wheel through pipx, its receiver SDK found beside it, run from another empty folder with the
    # instance kept where PROMESA_HOME says.
    pipx_home, other, home = tmp_path / "pipx", tmp_path / "other", tmp_path / "home"
    other.mkdir()
    pipx_env = dict(env, PIPX_HOME=str(pipx_home), PIPX_BIN_DIR=str(pipx_home / "bin"),
                    PIPX_MAN_DIR=str(pipx_home / "man"))
    installed = subprocess.run([sys.executable, "-m", "pipx", "install", "--python", sys.executable,
                                f"--pip-args=-c {source / 'constraints.txt'} --find-links {dist}",
                                str(dist / f"promesa-{versions['promesa']}-py3-none-any.whl")],
                               env=pipx_env, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    from_pipx = pipx_home / "bin" / "promesa"
    assert run(from_pipx, "--version", where=other) == f"promesa {versions['promesa']}"
    run(from_pipx, "db", "upgrade", where=other, home=home)
    assert (home / "promesa.db").is_file() and list(other.iterdir()) == []


def _post_json(url: str, token: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Authorization": f"Bearer {token}",
                                                                      "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp)


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except OSError:
        return None
