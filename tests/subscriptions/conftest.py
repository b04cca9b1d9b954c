"""The SDK tests' real receivers (tests/sdk/conftest.py), as fixtures here too: imported, not copied."""

from tests.sdk.conftest import bad_receiver, case_url, example, secret  # noqa: F401  (fixtures)
