import sys

from ioattn.cli import main

sys.exit(main())
