"""Training scripts that use hotswap.train; the demo runs them (shipped as hotswap.examples)."""
