"""The plan: which pages of which expert stay resident where, its JSON check, the solve options and
the bridge to `solvers.Problem`.
"""
