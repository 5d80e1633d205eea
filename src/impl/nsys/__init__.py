"""Nsight Systems (issue 45): profile named workloads under `nsys` on the GPU machine, and read what
it writes into typed rows.

Layer: above `workloads` and `bench` (the runner starts their workloads in child processes under
nsys), below `report` (which reads the rows and figures). Reading and drawing never import torch's
CUDA path, so they run on the CPU machine where the outputs are committed:

  tables    `nsys stats --format csv` reports (cuda_gpu_kern_sum, nvtx_sum, nvtx_kern_sum)
  timeline  the SQLite export: kernels per stream and device, NCCL or compute, the enclosing NVTX
            ranges; the NVTX ranges themselves
  figure    the per-stream timeline PNG (compute and NCCL kernels on one time axis, ranges above)
  outputs   where a case's files lie, the run's manifest, and packing them into the few files the
            device tool returns
  cases     the named workloads (what runs under nsys, with which nsys options)
  workloads the child-process entry that runs one case with its NVTX ranges
  run       the GPU-machine entry: checks nsys, profiles each case, writes stats, export, manifest
"""
