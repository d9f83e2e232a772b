"""Reading a save_dir: Inspect logs as frames (`logs`, `frames`), one statistics module (`stats`), the results
table (`table`), the one comparison path of a job, a sweep, a rescore and the study (`compare`), and plots.

Why apart from `evaluation`: everything here only reads what a run left (a rescore, a sweep's aggregate and the
study's report use it without running anything), and none of the runner's concerns (collators, locks, claims,
the pipeline) reach it. Nothing here runs a model or imports a control or backend; Inspect is imported lazily,
when logs are read.
"""
