"""`gaca inspect`: what the inspector computes (data), draws (view) and plots (plot)."""
