"""Kept for receivers that import the SDK by its old name: the receiver SDK is now its own
distribution, `promesa-receiver` (folder `sdk/`), imported as `promesa_receiver`."""

from promesa_receiver import *  # noqa: F401,F403
from promesa_receiver import __all__  # noqa: F401
