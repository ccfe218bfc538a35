"""``python -m unifiedamp.cli``: the ``unifiedamp`` command (backends' subprocesses run it so)."""

import sys

from unifiedamp.cli import main

sys.exit(main())
