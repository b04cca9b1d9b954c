"""Kept for code that imports the signing helpers by their old name: they live in the receiver SDK
(`promesa_receiver.signing`), so the signer and every verifier share one implementation."""

from promesa_receiver.signing import *  # noqa: F401,F403
from promesa_receiver.signing import __all__  # noqa: F401
