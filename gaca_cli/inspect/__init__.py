"""`gaca inspect`: the annotated log (data), what each view computes (views), draws (terminal) and plots (plot)."""
