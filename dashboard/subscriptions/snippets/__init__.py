"""Copy-paste verification code shown on every subscription's contract page.

These files are the snippets themselves (not templates), so the test suite runs exactly
what a receiver developer copies: the Python ones in-process, the TypeScript ones under Node.
"""

from pathlib import Path

HERE = Path(__file__).parent

FILES = {
    ("promesa", "python"): "verify_promesa.py",
    ("promesa", "typescript"): "verify_promesa.ts",
    ("standard-webhooks", "python"): "verify_standard.py",
    ("standard-webhooks", "typescript"): "verify_standard.ts",
}


def source(scheme: str, language: str) -> str:
    return (HERE / FILES[(scheme, language)]).read_text()
