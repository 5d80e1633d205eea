"""`python -m impl.report [--root ROOT]`: rebuilds reports/ (the index, one page per problem, the CPU
smoke page, figures and CSVs) from reports/data/** of the repository it is run in (impl.report.build)."""
import sys

from impl.report.build import main

if __name__ == "__main__":
    sys.exit(main())
