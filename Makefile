# The only commands a user needs. Each sets the environment up first (tools/setup.sh).
#   make perf     benchmark suite (smoke profile on a CPU, full on a GPU) → reports/data/<device>/, then the report
#   make test     correctness tests + the perf suite's smoke profile, then the diff against the CPU baseline
#   make report   rebuild reports/ from reports/data/** only
#   make compare  diff the last smoke run against the committed CPU baseline (pytest-benchmark compare)
# Options: SECTIONS="benchmarking_script flash_benchmarking" picks perf files; SUITE_PROFILE=smoke|full.

PY := $(shell tools/setup.sh)
SLUG = $(shell PYTHONPATH=src $(PY) -m impl.runtime slug)
SECTIONS ?= $(patsubst perf/test_%.py,%,$(wildcard perf/test_*.py))
OUT ?= out
PYTEST = PYTHONPATH=src $(PY) -m pytest
BENCH_CLI = PYTHONPATH=src $(PY) -c "import sys; from pytest_benchmark.cli import main; sys.exit(main())"

.PHONY: install test correctness smoke perf report compare clean stress

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

perf:
	@mkdir -p reports/data/$(SLUG)
	@set -e; for s in $(SECTIONS); do \
	  $(PYTEST) perf/test_$$s.py -q --timeout=1800 --benchmark-json=reports/data/$(SLUG)/$$s.json; \
	done
	$(MAKE) report

report:
	PYTHONPATH=src $(PY) -m impl.report

compare:
	@set -e; for s in $(SECTIONS); do \
	  if [ -f reports/data/cpu/$$s.json ] && [ -f $(OUT)/smoke/$$s.json ]; then \
	    $(BENCH_CLI) compare --group-by=group --sort=name --columns=mean,stddev,rounds \
	      reports/data/cpu/$$s.json $(OUT)/smoke/$$s.json; \
	  else echo "compare: no baseline or run for $$s"; fi; \
	done

# The distributed correctness files N times back to back; stops at the first failure (issue 23).
N ?= 10
STRESS_FILES = correctness/test_distributed.py correctness/test_sharded_optimizer.py correctness/test_fsdp.py
stress:
	@set -e; for i in $$(seq $(N)); do \
	  echo "stress $$i/$(N)"; $(PYTEST) $(STRESS_FILES) -q --timeout=900; \
	done; echo "stress: $(N) of $(N) passed"

clean:
	rm -rf $(OUT) .benchmarks .pytest_cache .hypothesis
