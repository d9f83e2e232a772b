"""Reading a save_dir: Inspect logs as frames (`logs`, `frames`), one statistics module (`stats`), the results
table (`table`), the one comparison path of a job, a sweep, a rescore and the study (`compare`), and plots.

Nothing here runs a model or imports a control or backend; Inspect is imported lazily, when logs are read.
"""
