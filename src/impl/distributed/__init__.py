"""Distributed training: process launching, collective benchmarks, data
parallelism (DDP variants), optimizer-state sharding (ZeRO-1) and fully sharded
data parallelism (FSDP)."""

from impl.distributed.collectives import algorithm_bandwidth, allreduce_benchmark, bus_bandwidth
from impl.distributed.ddp import DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive
from impl.distributed.fsdp import FSDP
from impl.distributed.launcher import default_backend, device_for, init_from_env, launch
from impl.distributed.sharded_optimizer import ShardedOptimizer, ZeRO1Optimizer

__all__ = [
    "DDPBucketed",
    "DDPFlat",
    "DDPIndividualParameters",
    "DDPNaive",
    "FSDP",
    "ShardedOptimizer",
    "ZeRO1Optimizer",
    "algorithm_bandwidth",
    "allreduce_benchmark",
    "bus_bandwidth",
    "default_backend",
    "device_for",
    "init_from_env",
    "launch",
]
