"""This process and its machine: the CPU and GPUs (``hardware``), the numeric precision chosen for them
(``precision``), the CPU threads and allocator of a process (``cpu``), the rank seam (``ranks``: the only code
that tests the rank), stop signals, NaN losses and silent peers (``stopping``), and ``doctor``'s machine report
with its measured probe. Imports ``models``, ``results``, ``config`` and ``errors`` only."""
