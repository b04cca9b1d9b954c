"""Promesa: webhook delivery that keeps its promises.

The package root stays free of Flask so that `dashboard.receiver` and `dashboard.signing`, kept as
aliases of the receiver SDK (`promesa_receiver`, its own distribution in `sdk/`), import cheaply.
"""


def create_app(test_config=None):
    from .app import create_app as _create_app

    return _create_app(test_config)
