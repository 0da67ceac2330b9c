"""``python -m fusegrad.aot``: the ``fusegrad-aot`` command line (:mod:`fusegrad.aot.cli`)."""

import sys

from fusegrad.aot.cli import main

sys.exit(main())
