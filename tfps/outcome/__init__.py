"""What a job leaves behind: results.json and its history, the report and message, the loss plot.

``contract`` is results.json's schema (``JobResult``: one writer, every reader loads it
through ``JobResult.load``, and the one summary of a job), ``results`` the chief's other
files in model_dir (history, the run identity, the export marker), ``journal`` the job's attempts across
restarts (its first start, the failures it recovered from), ``report`` turns a finished
(or failed) job into that record and the one completion message, ``plot`` draws the loss
curve the message carries. Only the chief writes here.
"""
