"""`colls bench`: nccl-tests-style timings of colls beside MPI's and Gloo's collectives, in one run.

`spec` says what a run measures (sizes, bus-bandwidth factors), `cases` holds one point's buffers and
its exact check, `runner` runs on the ranks under mpiexec, `baselines` wraps mpi4py and
torch.distributed, `report` prints the table and writes the JSON and the plot, `memcheck` watches
resident memory over back-to-back calls, `cli` is the command, and `targets` judges the issue's
speed targets from `--json` files.
"""
