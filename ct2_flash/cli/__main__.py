"""``python -m ct2_flash.cli``."""

import sys

from ct2_flash.cli import main

sys.exit(main())
