"""The producer client is its own distribution and needs nothing beyond the standard library."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import promesa_producer

HOME = Path(promesa_producer.__file__).parents[1]  # sdk/producer


def test_the_distribution_declares_no_dependency():
    project = tomllib.loads((HOME / "pyproject.toml").read_text())["project"]
    assert (project["name"], project["dependencies"]) == ("promesa-producer", [])
    assert "optional-dependencies" not in project


def test_every_import_is_the_standard_library_or_the_package_itself():
    modules = sorted((HOME / "promesa_producer").glob("*.py"))
    assert len(modules) >= 4
    outside = set()
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                outside |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                outside.add(node.module.split(".")[0])
    assert outside - set(sys.stdlib_module_names) - {"__future__"} == set()
    assert {"urllib", "sqlite3"} <= outside
