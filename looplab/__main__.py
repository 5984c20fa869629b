import sys

from looplab.cli import main

sys.exit(main())
