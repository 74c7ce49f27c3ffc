"""What a person reads: the terminal matrix, the Markdown summary, the gate's summary.

Pure functions of :mod:`pytest_llmspeed.results` records; no pytest import."""
