"""State controls: hooks on attention and the residual stream during a call (PASTA, CAA, ActAdd)."""
