"""Collecting routing: running a model (or asking a server) over corpora and writing what
each MoE layer selected. collect and capture hook a checkpoint, server and http ask a
serving engine, corpora reads the user's text, runs names and checks a collection."""
