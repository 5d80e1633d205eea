"""Distributed training: process launching, collective benchmarks, data
parallelism (DDP variants), optimizer-state sharding (ZeRO-1), fully sharded
data parallelism (FSDP), tensor parallelism and the 2-D FSDP x TP FFN."""

from impl.distributed.collectives import algorithm_bandwidth, allreduce_benchmark, bus_bandwidth
from impl.distributed.ddp import DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive, DDPReduceToOwner
from impl.distributed.fsdp import FSDP
from impl.distributed.fsdp_tp import FSDPTPFeedForward, Mesh2D, make_mesh
from impl.distributed.launcher import default_backend, device_for, init_from_env, launch
from impl.distributed.ring import RingCollectives, TorchCollectives, Traffic
from impl.distributed.sharded_optimizer import ShardedOptimizer, ZeRO1Optimizer
from impl.distributed.tensor_parallel import TensorParallel

__all__ = [
    "DDPBucketed",
    "DDPFlat",
    "DDPIndividualParameters",
    "DDPNaive",
    "DDPReduceToOwner",
    "FSDP",
    "FSDPTPFeedForward",
    "Mesh2D",
    "RingCollectives",
    "ShardedOptimizer",
    "TensorParallel",
    "TorchCollectives",
    "Traffic",
    "ZeRO1Optimizer",
    "algorithm_bandwidth",
    "allreduce_benchmark",
    "bus_bandwidth",
    "default_backend",
    "device_for",
    "init_from_env",
    "launch",
    "make_mesh",
]
