"""`python -m placer` runs the CLI."""

from placer.cli import main

main()
