"""`python -m attnlab` is the same as the `attnlab` console script."""
import sys

from attnlab.cli import main

sys.exit(main())
