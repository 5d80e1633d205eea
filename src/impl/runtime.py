"""Where the suite runs: device choice, environment facts, synchronisation, the profile."""
import contextlib
import os
import platform

import torch


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def launch_ctx(x: torch.Tensor, name: str):
    """Around a Triton launch made from Python outside any torch op (the eager flash launchers,
    AdamWMaster): the CUDA device of `x` made current (Triton launches on the current device;
    nothing for CPU tensors, the Triton interpreter) and, while a profiler runs, an op named
    `name` around the launch. The profiler links a kernel to the innermost *op* that launched it
    (a record_function range is not one), so without it such kernels are missing from the phase
    tables (impl.workloads.kernels) and their time counts as host gap. Inductor wraps its own
    launches the same way; without a profiler the op costs nothing."""
    stack = contextlib.ExitStack()
    if x.is_cuda:
        stack.enter_context(torch.cuda.device(x.device))
    if torch.autograd.profiler._is_profiler_enabled:
        stack.enter_context(torch._C._profiler._RecordFunctionFast(name))
    return stack


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for all queued device work; GPU work is asynchronous, so every timer reads the
    clock only after this."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_name() -> str:
    """`smoke` (tiny configs, CPU minutes) or `full` (the assignment's grids). SUITE_PROFILE
    overrides; the default follows the hardware."""
    name = os.environ.get("SUITE_PROFILE") or ("full" if torch.cuda.is_available() else "smoke")
    if name not in ("smoke", "full"):
        raise ValueError(f"SUITE_PROFILE must be 'smoke' or 'full', got {name!r}")
    return name


def device_name(device: torch.device | None = None) -> str:
    device = device or default_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def env_info(device: torch.device | None = None) -> dict:
    device = device or default_device()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # triton is optional on non-Linux CPUs
        triton_version = None
    info = dict(
        device=device_name(device),
        device_type=device.type,
        torch=torch.__version__,
        triton=triton_version,
        cuda=torch.version.cuda,
        profile=profile_name(),
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu_count=torch.cuda.device_count(), sm_count=props.multi_processor_count,
                    gpu_memory_bytes=props.total_memory)
    else:
        info.update(cpu_threads=torch.get_num_threads())
    return info


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def first_line(exc: BaseException | str, limit: int = 300) -> str:
    """An error's first line, cut to `limit` characters: what a row records of an OOM or failure."""
    return (str(exc).strip().splitlines() or [""])[0][:limit]


def free_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":  # `python -m impl.runtime profile`
    print(profile_name())
