"""Measurements on a GPU, each module one role; ``python -m specdiag.bench`` records them.

* ``timing``: the ceilings, timed calls with rotated inputs, the context sweep and split tuning;
* ``checks``: the native kernels against the float64 reference;
* ``ablation``: a kernel rebuilt with stages left out (``TV_SKIP``), each timed.

Every result file carries the machine's metadata (``specdiag.machine``).
"""
