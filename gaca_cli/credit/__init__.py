"""The maths: estimator config, GRPO / GiGPO / GACA, step groups, the run summary."""
