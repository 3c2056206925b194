"""python -m shmload: the same as the shmload command."""

import sys

from .cli import main

sys.exit(main())
