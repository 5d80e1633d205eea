"""The report's sections in order; each is render(df_of_one_device, device, fig_dir, fig_rel) -> str | None."""
from impl.report import benchmarking

ALL = [benchmarking.render]
