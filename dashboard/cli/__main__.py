"""`python -m dashboard.cli`: the `promesa` command."""
from dashboard.cli import main

main()
