"""``python -m pgjobs``: the ``pgjobs`` command line."""

import sys

from pgjobs.cli import main

sys.exit(main())
