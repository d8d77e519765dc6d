"""The roles a node plays: the pserver (an IO shell around a sans-IO core, one policy per mode) and
the trainer, their protocol, checkpoints, a job's programs, the in-process cluster, a node
process's entry point and the progress it reports."""
