"""What the commands print: the full tables of a plan, an evaluation, a bench, a spec, and the
short summaries (at most SUMMARY_LINES lines of at most TABLE_WIDTH columns) that `plan`,
`solve` and `evaluate` end with; the full tables go to a file beside their output and, with
--verbose, to the terminal.
"""
