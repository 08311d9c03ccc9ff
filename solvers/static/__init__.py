"""Static placements: which expert pages stay pinned, solved once from a profile.

The greedy and the ILP (OR-Tools) over the sample-average stall, their state of which steps
a pin saves (stall_state, cpu_state), the LP bound, the robust multi-profile objective and
the baselines every plan is compared with (layer offload, uniform)."""
