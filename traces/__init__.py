"""Collecting and storing routing traces: model hooks, corpora, the Parquet schema,
profiles and importers. traces/ never imports solvers/ or placer/, and never knows
about cards or budgets."""
