"""The server's templates, static files and migrations: at a checkout's top level, or inside an installed wheel.

The repository keeps them at its top level; the build maps them into `dashboard/_resources/` (setup.py), so
an installed Promesa carries them in its own package and runs from any folder.
"""

from __future__ import annotations

from pathlib import Path

RESOURCES = ("templates", "static", "migrations")
PACKAGED = Path(__file__).resolve().parents[1] / "_resources"
CHECKOUT = Path(__file__).resolve().parents[2]


def resource_folder(name: str) -> Path:
    """The folder `name` (one of RESOURCES) as this installation has it. A checkout has no packaged copy;
    an installed wheel's own comes first, never a folder beside it in site-packages."""
    if name not in RESOURCES:
        raise ValueError(f"{name!r} is not one of {', '.join(RESOURCES)}")
    folder = (PACKAGED if PACKAGED.is_dir() else CHECKOUT) / name
    if not folder.is_dir():
        raise FileNotFoundError(f"Promesa's {name}/ folder is missing ({folder}): reinstall Promesa")
    return folder
