"""``python -m tenure_cli``."""

import sys

from . import main

sys.exit(main())
