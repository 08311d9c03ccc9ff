class SolverError(ValueError):
    """A placement problem that cannot be solved as asked (infeasible budget, bad shapes)."""
