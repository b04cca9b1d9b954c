"""constraints.txt: what CI tests is what is deployed. Every pin is what this environment runs, and every
pin meets the lower bounds pyproject.toml sets (the first releases without a known advisory)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = [ROOT / "pyproject.toml", ROOT / "sdk" / "pyproject.toml", ROOT / "sdk" / "producer" / "pyproject.toml"]


def pins() -> dict[str, str]:
    lines = [line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    pairs = [line.split("==", 1) for line in lines if line and not line.startswith("#")]
    return {canonicalize_name(name): version for name, version in pairs}


def test_every_pin_is_what_this_environment_runs():
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    own = {"promesa", "promesa-receiver", "promesa-producer"}
    assert own.isdisjoint(pins()), "the project's own packages are installed from the checkout, never pinned"
    differing = {name: (version, installed.get(name)) for name, version in pins().items()
                 if installed.get(name, version) != version}
    assert differing == {}, "installed versions differ from constraints.txt: (pinned, installed)"


def test_every_pin_meets_the_bounds_the_projects_set():
    pinned = pins()
    for path in PROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        wanted = [*project["dependencies"], *sum(project.get("optional-dependencies", {}).values(), [])]
        for requirement in map(Requirement, wanted):
            name = canonicalize_name(requirement.name)
            if name in pinned:
                assert requirement.specifier.contains(pinned[name], prereleases=True), \
                    f"{path.relative_to(ROOT)}: {requirement} but constraints.txt pins {pinned[name]}"
