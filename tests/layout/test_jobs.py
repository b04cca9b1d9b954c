"""Every RQ job is named in one place, and the paths an older deploy queued still run."""

import ast
import importlib

from tests.layout.imports import modules

# What jobs queued by earlier deploys name: they must stay importable while such jobs can wait in Redis.
EARLIER_PATHS = ("dashboard.delivery.jobs.drain", "dashboard.subscriptions.checks.run",
                 "dashboard.operations.replays.run")


def _function(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name, None)


def test_every_job_the_code_enqueues_is_a_function_of_dashboard_jobs():
    enqueued = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "enqueue"):
                enqueued.update(arg.value for arg in node.args if isinstance(arg, ast.Constant)
                                and isinstance(arg.value, str) and arg.value.startswith("dashboard."))
    assert enqueued == {"dashboard.jobs.drain", "dashboard.jobs.receiver_check", "dashboard.jobs.replay"}
    assert all(callable(_function(path)) for path in enqueued)


def test_the_paths_earlier_deploys_queued_still_name_functions():
    assert all(callable(_function(path)) for path in EARLIER_PATHS)
