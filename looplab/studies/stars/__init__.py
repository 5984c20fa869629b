"""STARS: the paper beside our sweeps (paper), the looped-LM curves and drops (lm), the SmolLM2 retrofit
study (study, recipes, budget, retrofit), the fine-tune and stabiliser studies, and the norm diagnostic."""
