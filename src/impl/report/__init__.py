"""The report: markdown pages under reports/ built from the stored runs under reports/data/** only
(`python -m impl.report` rebuilds them all).

The stored runs are read once (data.py; legacy.py adapts the older format) into one row type,
rows.Bench (rows.py). Each page is two files: pages/<slug>.py declares the problems it answers
(impl.workloads.problems.Problem) and computes a frozen facts object from the rows, through its own
typed view of their config (rows.View) and the shared helpers (ratio.py, runs.py, markdown.py);
templates/<slug>.md.j2 holds every word of the page and of its index rows. build.py finds the page
modules, renders them and the index (index.py). The gate (gate.py) and compare (compare.py) are the
command-line checks over the same stored runs."""
