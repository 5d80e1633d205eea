"""The report's sections in order; each is render(df_of_one_device, device, fig_dir, fig_rel) -> str | None."""
from impl.report import accounting, benchmarking
from impl.report import distributed as distributed_report
from impl.report import attention as attention_report
from impl.report import profiling as profiling_report

ALL = [benchmarking.render, profiling_report.render, attention_report.render, accounting.render,
       distributed_report.render]
