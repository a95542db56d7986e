"""Share the machine's cores between the jobs of a sweep that run side by side.

torch runs its intra-op work on every core by default; two joblib workers on a 2-core machine
then fight over the same cores and the sweep is slower than running its jobs one after the
other. Each worker of a parallel launcher takes ``cores // n_jobs`` threads instead (at least
one). Where torch is not imported yet the setting goes into ``OMP_NUM_THREADS`` (and MKL's), so
that a job which never needs torch does not import it for this.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

#: The environment variables torch's thread pools read when it is imported.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def parallel_jobs(launcher: Mapping[str, Any] | None, cores: int) -> int:
    """How many jobs run side by side on this machine under ``launcher`` (Hydra's
    ``hydra.launcher`` node); 1 for launchers that run one job at a time or elsewhere."""
    n_jobs = (launcher or {}).get("n_jobs")
    if not isinstance(n_jobs, int) or n_jobs == 0:
        return 1
    if n_jobs < 0:  # joblib: -1 is every core, -2 all but one, ...
        n_jobs = max(1, cores + 1 + n_jobs)
    return max(1, min(n_jobs, cores))


def share_cores(n_jobs: int, cores: int | None = None) -> int:
    """Give this process ``cores // n_jobs`` threads (at least one); returns the count.

    Does nothing (returns the core count) for ``n_jobs <= 1``.
    """
    cores = cores or os.cpu_count() or 1
    if n_jobs <= 1:
        return cores
    threads = max(1, cores // n_jobs)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(threads)
    log.info(
        "sweep: %d jobs side by side on %d cores: %d torch threads each", n_jobs, cores, threads
    )
    return threads
