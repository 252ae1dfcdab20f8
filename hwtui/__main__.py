"""``python -m hwtui``: the same as the ``hwtui`` command."""

import sys

from hwtui.app.cli import main

sys.exit(main())
