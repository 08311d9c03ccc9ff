"""The checkpoint: config, safetensors headers, the expert inventory, sizes estimated from a
config, FLOPs, tiny test models.
"""
