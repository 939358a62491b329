"""``python -m cgguard``: see cgguard._cli."""

import sys

from cgguard._cli import main

sys.exit(main())
