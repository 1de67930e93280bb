"""Models: loading, tokenisation, scoring (action NLL), losses, offline training."""
