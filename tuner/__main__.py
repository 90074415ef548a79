"""``python -m cc1d.tuner`` = ``cc1d-tune``."""
import sys

from .cli import main

sys.exit(main())
