"""`python -m app.cli …`: the `blendrag` command."""

import sys

from app.cli import main

sys.exit(main())
