"""Shared test set-up.

Under pytest-xdist every worker is its own process: one torch thread each, or the workers' OpenMP
pools fight over the cores and run ~10x slower (measured on the 2-core CI machine).
"""

import os

import flowgrpo  # noqa: F401  (installs the torchvision compatibility hook for source-tree runs)
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
