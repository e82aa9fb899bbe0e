"""`python -m llm_vitals.remediator` runs the same CLI as `llm-vitals-remediator`."""

import sys

from .cli import main

sys.exit(main())
