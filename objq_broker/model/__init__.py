"""The queue model, pure: records and their wire format, the indexed state and its transitions,
payload references, and the message shapes of Dramatiq and Celery.

Nothing in this package does I/O, reads a clock or draws a random number: time, ids, tokens and
jitter are passed in, so an operation replayed after a failed write does what it did before.
"""
