"""The box: hardware specs (cards, links, host), presets, probing a real box, torch devices.
"""
