"""Running a program on one node: the executor and its kernels, scopes, tensors, sparse tables,
data sets, and what compute and the runtime's own work cost (charged, measured)."""
