"""Planning layer: pure Python, no GPU, no CuPy, no torch (a test keeps it so).

* :mod:`.table` — benchmark tables, the interchange format measurement writes and planning reads.
* :mod:`.plan` — plans: per kernel, a division of the mini-batch into micro-configurations.
* :mod:`.wr` — per-kernel dynamic programming under a workspace limit (WR).
* :mod:`.pareto` — desirable sets: divisions no other beats in both time and workspace.
* :mod:`.wd` — the whole-network ILP over those sets under one total budget (WD, PuLP).
* :mod:`.arena` — where each kernel's workspace segment lies in one arena.
* :mod:`.planner` — :func:`~.planner.plan`, the one entry point over all policies.
* :mod:`.network` — network specs (shipped, JSON, or traced from a PyTorch module).
* :mod:`.plots` — figures of Pareto sets and divisions (matplotlib, optional).

Nothing is imported here, so importing one planning module costs only that module.
"""
