"""`python -m llm_vitals.demo`."""

import sys

from llm_vitals.demo.cli import main

sys.exit(main())
