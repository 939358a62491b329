"""``python -m cgguard``: see cgguard._commands.main."""

import sys

from cgguard._commands.main import main

sys.exit(main())
