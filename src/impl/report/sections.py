"""The report's sections in order; each is render(df_of_one_device, device, fig_dir, fig_rel) -> str | None."""
from impl.report import (accounting, benchmarking, checkpointing, distributed, fsdp, profiling,
                         training_step)

ALL = [benchmarking.render, profiling.render, accounting.render, distributed.render, fsdp.render,
       checkpointing.render, training_step.render]
