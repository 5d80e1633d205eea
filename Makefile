# The only commands a user needs. Each sets the environment up first (tools/setup.sh).
#   make perf     benchmark suite (smoke profile on a CPU, full on a GPU): each section's run becomes a
#                 new file reports/data/<device>/<section>/<UTC time>_<commit>.json, then the report
#   make test     correctness tests + the perf suite's smoke profile, then the diff against the CPU baseline
#   make report   rebuild reports/ from reports/data/** only
#   make compare  the last smoke run against the newest committed CPU run of each section
#   make gate     each section's newest stored run against the run before it (fails on a regression
#                 beyond the row's noise band unless reports/accepted-changes.toml gives a reason)
#   make stress   the distributed correctness files N times in a row (N=10 by default; N=100 for a soak)
# Options: SECTIONS="benchmarking_script flash_benchmarking" picks perf files; SUITE_PROFILE=smoke|full.

PY := $(shell tools/setup.sh)
SECTIONS ?= $(patsubst perf/test_%.py,%,$(wildcard perf/test_*.py))
OUT ?= out
PYTEST = PYTHONPATH=src $(PY) -m pytest

.PHONY: install test correctness smoke perf report compare gate stress clean

install:
	@echo "using $(PY)"

correctness:
	$(PYTEST) correctness -q -n 2 --timeout=900

# Every perf test also runs as a test: the smoke profile, timed for real, into $(OUT)/smoke/.
smoke:
	@mkdir -p $(OUT)/smoke
	@set -e; for s in $(SECTIONS); do \
	  SUITE_PROFILE=smoke $(PYTEST) perf/test_$$s.py -q --timeout=900 --benchmark-json=$(OUT)/smoke/$$s.json; \
	done

test: correctness smoke compare

# A section's run is written outside reports/ first and filed only when it finished: an interrupted
# run (Ctrl-C, a timeout) leaves reports/ as it was.
perf:
	@mkdir -p $(OUT)/runs
	@set -e; for s in $(SECTIONS); do \
	  $(PYTEST) perf/test_$$s.py -q --timeout=1800 --benchmark-json=$(OUT)/runs/$$s.json; \
	  PYTHONPATH=src $(PY) -m impl.bench.store $(OUT)/runs/$$s.json --section $$s; \
	done
	$(MAKE) report

report:
	PYTHONPATH=src $(PY) -m impl.report

compare:
	PYTHONPATH=src $(PY) -m impl.report.compare --device cpu $(addprefix $(OUT)/smoke/,$(addsuffix .json,$(SECTIONS)))

gate:
	PYTHONPATH=src $(PY) -m impl.report.gate

# The distributed correctness files N times back to back; stops at the first failure (issue 23).
N ?= 10
STRESS_FILES = correctness/test_distributed.py correctness/test_sharded_optimizer.py correctness/test_fsdp.py
stress:
	@set -e; for i in $$(seq $(N)); do \
	  echo "stress $$i/$(N)"; $(PYTEST) $(STRESS_FILES) -q --timeout=900; \
	done; echo "stress: $(N) of $(N) passed"

clean:
	rm -rf $(OUT) .benchmarks .pytest_cache .hypothesis
