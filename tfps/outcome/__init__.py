"""What a job leaves behind: results.json and its history, the report and message, the loss plot.

``results`` is the record on the chief's disk, ``journal`` the job's attempts across
restarts (its first start, the failures it recovered from), ``report`` turns a finished
(or failed) job into that record and the one completion message, ``plot`` draws the loss
curve the message carries. Only the chief writes here.
"""
