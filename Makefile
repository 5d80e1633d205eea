# The only commands a user needs. Each sets the environment up first (tools/setup.sh).
#   make perf     benchmark suite (smoke profile on a CPU, full on a GPU): each section's run becomes a
#                 new file reports/data/<device>/<section>/<UTC time>_<commit>.json.gz, then the report
#   make test     correctness tests + the perf suite's smoke profile, then the diff against the CPU baseline
#   make test-record  the correctness tests, their record filed under reports/data/<device>/tests/
#   make report   rebuild reports/ from reports/data/** only
#   make compare  each section's newest fresh run (make smoke or make perf), row by row, against the committed rows
#   make gate     each stored row's newest measurement against its previous one (fails on a regression
#                 beyond the row's noise band unless reports/accepted-changes.toml gives a reason)
#   make stress   the distributed correctness files N times in a row (N=10 by default; N=100 for a soak)
#   make repeat   issue 42's repeat on the CPU: N runs of the four distributed files with -x, each outcome
#                 kept in $(OUT)/repeat/repeat.json (tools/nccl_repeat.sh on a GPU machine)
# Options: SECTIONS="benchmarking_script flash_benchmarking" picks perf files; SUITE_PROFILE=smoke|full.

# `make ... PY=/path/to/python` uses that interpreter and skips the set-up
ifneq ($(origin PY),command line)
PY := $(shell tools/setup.sh)
endif
ALL_SECTIONS := $(patsubst perf/test_%.py,%,$(wildcard perf/test_*.py))
SECTIONS ?= $(ALL_SECTIONS)
OUT ?= out
PYTEST = PYTHONPATH=src $(PY) -m pytest
# Each `make perf` writes its runs into a folder of its own (UTC time and make's pid): two at once
# never share a file. (A second timed run on one device is refused anyway: impl.bench.runlock.)
RUN_DIR := $(OUT)/runs/$(shell date -u +%Y%m%dT%H%M%SZ)-$(shell echo $$PPID)

.PHONY: install test test-record correctness smoke perf report compare gate stress repeat clean check-sections check-n

# Make variables are checked before anything runs: a typo must not run nothing and pass.
check-sections:
	@test -n "$(strip $(SECTIONS))" || { echo "make: SECTIONS is empty; name one or more of: $(ALL_SECTIONS)" >&2; exit 2; }
	@bad="$(filter-out $(ALL_SECTIONS),$(SECTIONS))"; test -z "$$bad" || { \
	  echo "make: unknown section(s): $$bad (no perf/test_<section>.py); sections: $(ALL_SECTIONS)" >&2; exit 2; }

check-n:
	@case "$(N)" in ''|*[!0-9]*|0*) echo "make: N must be a whole number from 1, got '$(N)'" >&2; exit 2;; esac

install:
	@echo "using $(PY)"

# pytest's junit XML becomes $(OUT)/tests/record.json (impl.bench.test_record: counts, failures, commit,
# digests of the code tested) whether the tests pass or not; `make test-record` files it under
# reports/data/<device>/tests/, where the report's index shows it.
# SHARD=K/N runs the K-th of N disjoint parts of the suite (pytest --shard, impl.bench.shards) and marks
# the record as that shard: one device call each, merged with `python -m impl.bench.test_record merge`.
XDIST ?= $(shell n=$$(nproc); echo $$(( n > 12 ? 12 : (n < 2 ? 1 : n) )))
SHARD_ARGS = $(if $(SHARD),--shard $(SHARD))
correctness:
	@mkdir -p $(OUT)/tests; rm -f $(OUT)/tests/junit.xml $(OUT)/tests/record.json $(OUT)/tests/gpu-cases.jsonl
	@set +e; SUITE_CASE_LOG=$${SUITE_CASE_LOG:-$(abspath $(OUT))/tests/gpu-cases.jsonl} \
	  $(PYTEST) correctness -q -n $(XDIST) --dist worksteal --durations=25 --timeout=900 $(SHARD_ARGS) \
	  --junitxml=$(OUT)/tests/junit.xml; rc=$$?; \
	  PYTHONPATH=src $(PY) -m impl.bench.test_record $(OUT)/tests/junit.xml --out $(OUT)/tests/record.json \
	    --command "pytest correctness -n $(XDIST) --dist worksteal$(if $(SHARD), --shard $(SHARD))" $(SHARD_ARGS) \
	    || true; exit $$rc

# Every perf test also runs as a test: the smoke profile, timed for real, into $(OUT)/smoke/.
smoke: check-sections
	@mkdir -p $(OUT)/smoke
	@set -e; for s in $(SECTIONS); do \
	  SUITE_PROFILE=smoke $(PYTEST) perf/test_$$s.py -q --timeout=900 --benchmark-json=$(OUT)/smoke/$$s.json; \
	done

# On a GPU machine `make test` is the correctness suite with its GPU tests (519 s of pytest with -n 12 on a
# fresh H100 at 50a7f58: the device tool's 600 s call is nearly full): the smoke profile is the CPU's (tiny
# configs; its baseline is the committed CPU runs), and `make perf` runs the full profile there.
HAS_GPU = $(shell PYTHONPATH=src $(PY) -c "import torch; print(int(torch.cuda.is_available()))")
test: correctness
	@if [ "$(HAS_GPU)" = 1 ]; then echo "smoke and compare: skipped on a GPU machine (CPU profile and baseline)"; \
	  else $(MAKE) --no-print-directory smoke compare; fi

# The correctness suite's record filed under reports/data/<device>/tests/ (commit it). With SHARD the
# shard's record is made and its filing refused: merge the N shards' records, then file the merge.
test-record:
	-@$(MAKE) --no-print-directory correctness
	PYTHONPATH=src $(PY) -m impl.bench.test_record --file $(OUT)/tests/record.json

# A section's run is written outside reports/ first and filed only when it finished whole: an
# interrupted run (Ctrl-C, a timeout) or one with failed tests stays in $(RUN_DIR), reports/ as it was.
perf: check-sections
	@mkdir -p $(RUN_DIR)
	@set -e; for s in $(SECTIONS); do \
	  $(PYTEST) perf/test_$$s.py -q --timeout=1800 --benchmark-json=$(RUN_DIR)/$$s.json; \
	  PYTHONPATH=src $(PY) -m impl.bench.store $(RUN_DIR)/$$s.json --section $$s; \
	done
	$(MAKE) report

report:
	PYTHONPATH=src $(PY) -m impl.report

compare: check-sections
	PYTHONPATH=src $(PY) -m impl.report.compare --out $(OUT) $(SECTIONS)

gate:
	PYTHONPATH=src $(PY) -m impl.report.gate

# The distributed correctness files N times back to back; stops at the first failure (issue 23). Each
# repetition lists its 10 slowest tests: on 2×H200 one took 321 s, and 20 of them must fit device budgets.
N ?= 10
STRESS_FILES = correctness/test_distributed.py correctness/test_sharded_optimizer.py correctness/test_fsdp.py
stress: check-n
	@set -e; for i in $$(seq $(N)); do \
	  echo "stress $$i/$(N)"; $(PYTEST) $(STRESS_FILES) -q --timeout=900 --durations=10; \
	done; echo "stress: $(N) of $(N) passed"

# Issue 42's repeat: the command that once failed on NCCL (the four distributed files, serially, -x)
# N times within BUDGET_S seconds, every outcome kept in $(OUT)/repeat/repeat.json (impl.bench.repeat;
# tools/nccl_repeat.sh on the GPU machines, one pair of GPUs per repetition). Here: gloo on the CPU.
BUDGET_S ?= 3600
repeat: check-n
	PYTHONPATH=src $(PY) -m impl.bench.repeat run --cpu --n $(N) --budget-s $(BUDGET_S) --out $(OUT)/repeat

clean:
	rm -rf $(OUT) .benchmarks .pytest_cache .hypothesis
