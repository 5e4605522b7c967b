"""python -m gallery RUN_DIR [--out DIR] [--serve] [--port N]"""

from gallery.cli import main

raise SystemExit(main())
