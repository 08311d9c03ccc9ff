"""The placement problem and its solvers: pure functions over numpy arrays.

solvers/ never touches safetensors bytes and never imports placer/. It may import
traces/ (the stage before it) for step sampling helpers.
"""
