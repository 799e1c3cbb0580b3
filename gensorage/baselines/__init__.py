"""Baselines the Markov construction is compared with, all scored by the same cost model.

- :mod:`gensorage.baselines.roller`: a Roller-like greedy tree constructor (one objective, no backtracking);
- :mod:`gensorage.baselines.optuna_search`: Optuna TPE over the schedule space;
- :mod:`gensorage.baselines.random_search`: uniform random sampling of the same space.

Each returns a :class:`gensorage.markov.outcome.SearchOutcome`; ``gensorage.tuning.METHODS`` maps names to them.
"""
