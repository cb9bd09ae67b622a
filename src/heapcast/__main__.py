"""`python -m heapcast` runs the heapcast command."""
import sys

from .cli import main

sys.exit(main())
