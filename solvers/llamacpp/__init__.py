"""llama.cpp's family: its expert cache as each build runs it (one module per policy), what a
llama.cpp setup costs at decode (`cost`), and the search over its options (`search`).

Kept apart from the generic planner (solvers/cache, solvers/cpu.py, ...): these modules
model one engine's code, read from its source, and change when that engine does
(docs/llamacpp.md says which build each rule comes from).
"""
