"""Serving a placed model (`placer serve`) and measuring it (`placer bench`)."""
