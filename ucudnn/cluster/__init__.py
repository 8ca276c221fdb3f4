"""Precomputing plans for a cluster: units of work measured on engines' workers, planned on CPUs, stored.

* :mod:`.precompute` — the job: targets x kernels x policies, progress, the failure report.
* :mod:`.engines` — where units run: ``local`` (a process per GPU) or ``ray`` (a Ray cluster).
"""
