"""The placed directory: its byte layout, streaming writes, the transactional commit, the manifest,
verification and remembered digests.
"""
