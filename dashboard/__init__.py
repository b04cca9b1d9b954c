"""Promesa: webhook delivery that keeps its promises.

The package root stays free of Flask so that `dashboard.receiver` and
`dashboard.signing` import on a receiver's machine with the standard library only.
"""


def create_app(test_config=None):
    from .app import create_app as _create_app

    return _create_app(test_config)
