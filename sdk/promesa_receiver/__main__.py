"""``python -m promesa_receiver check URL --secret S``: the same as the ``promesa-receiver`` command."""

import sys

from .cli import main

sys.exit(main())
