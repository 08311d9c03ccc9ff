"""llama.cpp itself, run from placer through the side environment `make llama-env` builds:
routing recorded through llama.cpp (`collect`), its expert cache observed (`cache`), its CPU
kernels timed (`kernels`); `runner` talks to the scripts (`worker`, `kernels`) that run there."""
