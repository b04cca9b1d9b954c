"""The layout stays true: no import circles, imports walk down the areas' ranks, the bench stays outside."""

import subprocess
import sys

from tests.layout.imports import ROOT, circles, graph, imports_of, modules, uphill


def test_no_module_imports_itself_back_through_others():
    assert circles(graph()) == []


def test_imports_walk_one_way_down_the_areas():
    assert uphill(graph()) == []


def test_no_server_module_names_the_bench():
    named = {m: sorted(t for t in targets if t.startswith("promesa_bench"))
             for m, targets in graph().items() if m.startswith("dashboard")}
    assert {m: t for m, t in named.items() if t} == {}


def test_a_lazy_import_inside_a_function_counts(tmp_path):
    package = tmp_path / "dashboard"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "clock.py").write_text("def now():\n    from dashboard import models\n")
    (package / "models.py").write_text("from dashboard.core import clock\n")
    known = {"dashboard": package / "__init__.py", "dashboard.core": package / "core" / "__init__.py",
             "dashboard.core.clock": package / "core" / "clock.py", "dashboard.models": package / "models.py"}
    edges = {name: imports_of(name, path, known) for name, path in known.items()}
    assert circles(edges) == [["dashboard.core.clock", "dashboard.models"]]
    assert uphill(edges) == ["dashboard.core.clock -> dashboard.models"]


def test_every_area_is_a_package_of_the_tree():
    areas = {name.split(".")[1] for name in modules() if name.startswith("dashboard.") and name.count(".") >= 1}
    assert {"core", "queue", "stats", "ingest", "delivery", "subscriptions", "accounts", "operations", "web",
            "cli"} <= areas


def test_a_worker_loads_neither_the_bench_nor_psutil():
    # As deployed without the otel extra: OpenTelemetry's SDK, which redis-py imports whenever it is installed,
    # loads psutil (the bench's, here) for its process resource on its own; the extra does not install psutil.
    probe = ("import sys\n"
             "sys.modules['opentelemetry'] = None\n"
             "from dashboard.cli import cli\n"
             "from dashboard.delivery import worker\n"
             "loaded = sorted(m for m in sys.modules if m.startswith(('promesa_bench', 'psutil')))\n"
             "print(','.join(loaded))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
