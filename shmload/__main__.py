"""python -m shmload: the same as the shmload command."""

import sys

from .tools.cli import main

sys.exit(main())
