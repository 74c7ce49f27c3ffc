"""The measurement core: the client, the server probe, prompts, the two cells' protocol,
statistics, the matrix arithmetic and the benchmark driver. It imports no pytest; the pytest
layer (``pytest_llmspeed.plugin``) drives it, and so can any script."""
