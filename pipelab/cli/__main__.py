"""``python -m pipelab.cli COMMAND ...``: the ``pipelab`` command without the installed script."""

import sys

from pipelab.cli import main

sys.exit(main())
