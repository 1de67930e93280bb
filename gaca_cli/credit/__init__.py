"""The maths: estimator config, GRPO / GiGPO / GACA / HGPO, step groups, the run summary."""
