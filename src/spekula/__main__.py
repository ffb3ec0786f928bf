import sys

from spekula.cli import main

sys.exit(main())
