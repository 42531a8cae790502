"""``python -m llmgw.sim --model NAME``: see docs/sim.rst."""

import sys

from llmgw.sim.server import main

sys.exit(main())
