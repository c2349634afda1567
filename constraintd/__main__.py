import sys

from constraintd.cli import main

sys.exit(main())
