"""The prediction: replaying held-out traffic against a plan (evaluate), drift, the calibration
curve, expected staging, plots.
"""
