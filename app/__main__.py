import sys

from hwtui.app.cli import main

sys.exit(main())
