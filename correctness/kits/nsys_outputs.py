"""Synthetic Nsight Systems outputs for the nsys tests: an SQLite export with the real schema's
columns (more than impl.nsys reads, as a real export has) and stats CSVs with nsys's headers.

The export: two ranks (pids 100 and 200 on GPUs 0 and 1), each one training step "step 0" holding
"forward" [0, 300] us, "backward" [300, 800] us and "optimizer step" [800, 1000] us on its main
thread (tid 1). Compute kernels run on stream 7, NCCL kernels on stream 20. Rank 0 also launches a
backward kernel from another thread (tid 2: autograd's) and one kernel before any range."""
from __future__ import annotations

import sqlite3
from pathlib import Path

US = 1000  # ns
HIGH = 1 << 56  # nsys sets bits above the pid in globalTid / globalPid


def gtid(pid: int, tid: int) -> int:
    return HIGH | (pid << 24) | tid


KERNEL_SCHEMA = ("start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL, "
                 "greenContextId INT, streamId INT NOT NULL, correlationId INT, globalPid INT, demangledName INT NOT NULL, "
                 "shortName INT NOT NULL, mangledName INT, launchType INT, cacheConfig INT, registersPerThread INT NOT NULL, "
                 "gridX INT NOT NULL, gridY INT NOT NULL, gridZ INT NOT NULL, blockX INT NOT NULL, blockY INT NOT NULL, "
                 "blockZ INT NOT NULL, staticSharedMemory INT NOT NULL, dynamicSharedMemory INT NOT NULL, "
                 "localMemoryPerThread INT NOT NULL, localMemoryTotal INT NOT NULL, gridId INT NOT NULL, "
                 "sharedMemoryExecuted INT, graphNodeId INT, sharedMemoryLimitConfig INT")
RUNTIME_SCHEMA = ("start INT NOT NULL, end INT NOT NULL, eventClass INT NOT NULL, globalTid INT, correlationId INT, "
                  "nameId INT NOT NULL, returnValue INT NOT NULL, callchainId INT")
NVTX_SCHEMA = ("start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT, category INT, color INT, text TEXT, "
               "globalTid INT, endGlobalTid INT, textId INT, domainId INT, uint64Value INT, int64Value INT, "
               "doubleValue REAL, uint32Value INT, int32Value INT, floatValue REAL, jsonTextId INT, jsonText TEXT")
GPU_SCHEMA = ("id INT NOT NULL, name TEXT NOT NULL, busLocation TEXT NOT NULL, isDiscrete INT NOT NULL, "
              "l2CacheSize INT NOT NULL, totalMemory INT NOT NULL, memoryBandwidth INT NOT NULL, clockRate INT NOT NULL, "
              "smCount INT NOT NULL, uuid TEXT, chipName TEXT")

# (pid, device, stream, launching tid, launch us, start us, end us, name)
KERNELS = [
    (100, 0, 7, 1, -50, -40, -30, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >"),
    (100, 0, 7, 1, 10, 20, 120, "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"),
    (100, 0, 7, 1, 130, 140, 200, "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>"),
    (100, 0, 7, 2, 310, 320, 600, "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_cublas"),
    (100, 0, 20, 2, 400, 450, 700, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    (100, 0, 7, 1, 810, 820, 900, "_adamw_master_kernel"),
    (200, 1, 7, 1, 12, 25, 130, "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"),
    (200, 1, 7, 2, 320, 330, 610, "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_cublas"),
    (200, 1, 20, 2, 410, 460, 720, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
]
RANGES = [("step 0", 0, 1000), ("forward", 0, 300), ("backward", 300, 800), ("optimizer step", 800, 1000)]


def write_export(path: Path, *, kernels=KERNELS, drop_table: str | None = None, drop_column: tuple[str, str] | None = None,
                 registered_names: bool = False, ranges=RANGES) -> Path:
    """The synthetic export at `path`. `drop_table` / `drop_column` (table, column) leave part of the
    schema out, for the error tests; `registered_names`: NVTX names via textId (text NULL), as
    registered strings are exported."""
    schemas = {"CUPTI_ACTIVITY_KIND_KERNEL": KERNEL_SCHEMA, "CUPTI_ACTIVITY_KIND_RUNTIME": RUNTIME_SCHEMA,
               "NVTX_EVENTS": NVTX_SCHEMA, "TARGET_INFO_GPU": GPU_SCHEMA,
               "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
               "OSRT_API": "start INT, end INT, nameId INT", "ENUM_NSYS_EVENT_TYPE": "id INT, name TEXT, label TEXT"}
    if drop_column:
        table, col = drop_column
        schemas[table] = ", ".join(c for c in schemas[table].split(", ") if not c.startswith(col + " "))
    db = sqlite3.connect(path)
    for table, schema in schemas.items():
        if table != drop_table:
            db.execute(f"CREATE TABLE {table} ({schema})")
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        return strings.setdefault(s, len(strings) + 1)

    def insert(table, **values):
        if table == drop_table:
            return
        cols = [c.split()[0] for c in schemas[table].split(", ")]
        values = {k: v for k, v in values.items() if k in cols}
        row = [values.get(c, 0) for c in cols]
        db.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)

    for corr, (pid, dev, stream, tid, launch, start, end, name) in enumerate(kernels, start=1):
        insert("CUPTI_ACTIVITY_KIND_KERNEL", start=start * US, end=end * US, deviceId=dev, contextId=1, streamId=stream,
               correlationId=corr, globalPid=gtid(pid, 0), demangledName=sid(name), shortName=sid(name.split("(")[0][:20]))
        insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=launch * US, end=launch * US + 5 * US, eventClass=1,
               globalTid=gtid(pid, tid), correlationId=corr, nameId=sid("cudaLaunchKernel_v7000"))
    for pid in (100, 200):
        for name, start, end in ranges:
            text, text_id = (None, sid(name)) if registered_names else (name, None)
            insert("NVTX_EVENTS", start=start * US, end=end * US, eventType=59, text=text, textId=text_id,
                   globalTid=gtid(pid, 1), domainId=0)
    insert("NVTX_EVENTS", start=5 * US, end=None, eventType=34, text="a marker, not a range", globalTid=gtid(100, 1))
    for dev in (0, 1):
        insert("TARGET_INFO_GPU", id=dev, name="NVIDIA H100 80GB HBM3", busLocation=f"0000:0{dev}:00.0")
    insert("OSRT_API", start=1, end=2, nameId=1)
    for s, i in strings.items():
        insert("StringIds", id=i, value=s)
    db.commit()
    db.close()
    return path


KERNEL_SUM = '''"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"62.5","500000","2","250000.0","250000.0","100000","400000","212132.0","sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"
"25.0","200000","1","200000.0","200000.0","200000","200000","0.0","ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
"12.5","100000","4","25000.0","24000.5","20000","32000","5000.0","void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>"
'''
NVTX_SUM = '''"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Style","Range"
"50.0","2000000","2","1000000.0","1000000.0","1000000","1000000","0.0","PushPop",":step 0"
"25.0","1000000","2","500000.0","500000.0","500000","500000","0.0","PushPop",":backward"
"15.0","600000","2","300000.0","300000.0","300000","300000","0.0","PushPop",":forward"
"10.0","400000","2","200000.0","200000.0","200000","200000","0.0","PushPop","optimizer step"
'''
NVTX_KERN_SUM = '''"NVTX Range","Style","PID","TID","NVTX Inst","Kern Inst","Total Time (ns)","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Kernel Name"
":forward","PushPop","100","1","1","1","100000","100000.0","100000.0","100000","100000","0.0","sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"
":forward","PushPop","100","1","1","1","60000","60000.0","60000.0","60000","60000","0.0","void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>"
":step 0","PushPop","100","1","1","3","260000","86666.7","80000.0","60000","100000","20816.7","sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas"
'''


CAPTURED = "c0ffee15" * 5  # the commit a synthetic run folder's CAPTURES.json says holds its captures


def file_run(data_dir: Path, device: str, stamp: str, cases: list[tuple[str, str, dict, Path | None]],
             commit: str = "abcdef1", captured: str | None = CAPTURED) -> Path:
    """A filed nsys call as impl.nsys.store lays it out in the tree: data_dir/<device>/nsys/<stamp>_<commit>/ with
    its manifest and FILED.json; `cases`: (name, group, workload args, export or None), each export's extracts under
    extract/ (impl.nsys.extract, what the pages read). The export and its GUI report are named in FILED.json's
    "kept" and, with the commit `captured` (None: no record), in CAPTURES.json only: the store keeps them in the
    branch's history, and the pages never read them. Returns the folder."""
    import gzip
    import json
    import tempfile

    from impl.nsys.extract import write_extracts
    from impl.nsys.outputs import CaseRecord, Manifest

    folder = data_dir / device / "nsys" / f"{stamp}_{commit}"
    (folder / "tables").mkdir(parents=True, exist_ok=True)
    recs, kept = [], dict(sqlite=[], rep=[], extract=[])
    for name, group, args, export in cases:
        if export is not None:
            with tempfile.TemporaryDirectory() as tmp:
                gz = Path(tmp) / f"{name}.sqlite.gz"
                gz.write_bytes(gzip.compress(Path(export).read_bytes()))
                kept["extract"] += [x.name for x in write_extracts(gz, folder / "extract")]
            kept["sqlite"].append(f"{name}.sqlite.gz")
            kept["rep"].append(f"{name}.nsys-rep")
        recs.append(CaseRecord(name, group, "profiled", 10.0, sqlite=export is not None, rep=export is not None,
                               workload=dict(status="ok", args=args)))
    m = Manifest("NVIDIA Nsight Systems version 2025.3.1.0", "2x NVIDIA H200", commit, stamp, tuple(recs))
    (folder / "manifest.json").write_text(m.to_json())
    (folder / "FILED.json").write_text(json.dumps(dict(device=device, note="synthetic", lost_files={}, kept=kept)))
    if captured is not None:
        (folder / "CAPTURES.json").write_text(json.dumps({f"{sub}/{n}": captured for sub in ("sqlite", "rep")
                                                          for n in kept[sub]}))
    return folder


MEMORY_SCHEMA = "start INT NOT NULL, globalPid INT NOT NULL, deviceId INT NOT NULL, bytes INT NOT NULL, memKind INT NOT NULL, memoryOperationType INT NOT NULL"


def write_memory_export(path: Path, events, ranges) -> Path:
    """A --cuda-memory-usage export: `events` (us, bytes, 0 alloc / 1 free, memKind), `ranges` (name, us, us)."""
    db = sqlite3.connect(path)
    db.execute(f"CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS ({MEMORY_SCHEMA})")
    db.execute(f"CREATE TABLE NVTX_EVENTS ({NVTX_SCHEMA})")
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    for t, b, op, kind in events:
        db.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?, 1, 0, ?, ?, ?)", (t * US, b, kind, op))
    cols = [c.split()[0] for c in NVTX_SCHEMA.split(", ")]
    for name, s, e in ranges:
        row = dict(start=s * US, end=e * US, eventType=59, text=name, globalTid=gtid(100, 1))
        db.execute(f"INSERT INTO NVTX_EVENTS VALUES ({', '.join('?' * len(cols))})", [row.get(c, 0) for c in cols])
    db.commit()
    db.close()
    return path
