"""``python -m pgjobs``: the ``pgjobs`` command line."""

import sys

from .cli import main

sys.exit(main())
