"""`python -m paddle_llm_openai ...`: see cli.py."""

import sys

from paddle_llm_openai.cli import main

sys.exit(main())
