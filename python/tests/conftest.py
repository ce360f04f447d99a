import os

# The Worker forks: keep numpy's BLAS from starting threads before pto is imported.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

# simpler/ holds programs in simpler's style that test_simpler.py runs through
# `python -m pto.simpler` (with simpler's names importable); pytest must not collect them here.
collect_ignore = ["simpler"]
