"""``python -m flowgrpo.cli``: the ``flowgrpo`` command."""

import sys

from flowgrpo.cli.tools import main

sys.exit(main())
