import sys

from gensorage.cli import main

sys.exit(main())
