"""The report: markdown pages under reports/ built from the stored runs under reports/data/** only
(`python -m impl.report` rebuilds them all).

Each page is facts plus a template: a typed facts object computed from the loaded rows (the
`*_facts.py` modules, over the typed row accessors of rows.py, ratio.py and runs.py) holds every number
and verdict, and a jinja2 template under templates/ (`<page>.md.j2`, rendered through templating.py)
holds the words. The page modules (pages/) put answers, tables, figures and run metadata together;
pages/problems.py maps each handout problem (impl.workloads.problems.Problem) to its page. The gate
(gate.py) and compare (compare.py) are the command-line checks over the same stored runs."""
