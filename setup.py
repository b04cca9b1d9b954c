"""The wheel carries the server's templates, static files and migrations, which the repository keeps at its top
level: each is mapped to a package under dashboard/_resources/ (dashboard.core.resources finds them there)."""

from setuptools import find_namespace_packages, setup

# Each folder and the files of it the wheel carries: never the __pycache__ a checkout's runs leave in migrations.
RESOURCES = {"templates": ["**/*.html"], "static": ["*"], "migrations": ["*", "versions/*.py"]}
MAPPED = {f"dashboard._resources.{folder}": folder for folder in RESOURCES}

setup(
    packages=[*find_namespace_packages(include=["dashboard*", "promesa_bench*"], exclude=["*.__pycache__"]),
              *MAPPED],
    package_dir=MAPPED,
    # Named here, and only these: what a checkout holds beside them (editor files, caches) stays out.
    include_package_data=False,
    package_data={"dashboard.subscriptions.snippets": ["*.ts"],
                  **{package: RESOURCES[folder] for package, folder in MAPPED.items()}},
)
