"""``python -m promesa_receiver check|listen ...``: the same as the ``promesa-receiver`` command."""

import sys

from .cli import main

sys.exit(main())
