"""What the perf suite runs: the course's sweep grids (sweeps, editions) and the recipes each perf
file times through impl.bench's harness: training steps (steps, compiled, leaderboard_2026), the
distributed ranks' worker commands (dist_steps, fsdp_steps, parallelism_steps, fresh_steps,
rank_memory), attention inputs and passes (attention), and the profiling recipes (kernels, memory,
block_memory). These import impl.bench's measurement core; the core never imports them."""
