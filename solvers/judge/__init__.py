"""Judging a placement on traffic: every step replayed against it and its baselines
(replay), each figure with its paired bootstrap interval over sequences (intervals)."""
