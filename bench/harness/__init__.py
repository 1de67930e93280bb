"""The research harness the benchmark programs run: the offline-improvement experiment
(`experiment.py`, run by bench/experiment.py) on key quests (`key_quests.py`), its statistics
over seeds (`statistics.py`), and the regime map of GACA and HGPO against GiGPO on true advantages
(`regimes.py`, run by bench/estimator_quality.py --regime-map). Not part of the gaca package."""
