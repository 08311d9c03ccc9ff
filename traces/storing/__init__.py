"""Storing routing: the Parquet schema, the writer, reading a trace directory back
(dataset), splitting it by sequence, and the statistics and profiles solvers consume."""
