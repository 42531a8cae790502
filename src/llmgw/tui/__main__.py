import sys

from llmgw.tui import main

sys.exit(main())
