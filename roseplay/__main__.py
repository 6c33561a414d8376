"""`python -m roseplay` = the `roseplay` command."""
import sys

from roseplay.cli import main

sys.exit(main())
