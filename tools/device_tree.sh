#!/usr/bin/env bash
# The device tool sends the checkout's tracked files (64 MiB at most); the committed Nsight captures
# (.nsys-rep, .sqlite.gz: ~47 MB of ~96 MB at 2026-11-26) put it over. No test or GPU run reads them
# (the 99ae8fa record passed without them), so before device calls they leave the index and are
# ignored through .git/info/exclude (files untouched on disk), and after the calls they come back.
#   tools/device_tree.sh hide      # before the first `run` of a session
#   tools/device_tree.sh restore   # after the last one, before any commit
#   tools/device_tree.sh status
# While hidden, `git commit -a` or `git add -A` would commit their deletion: commit only named paths
# (`git commit -m ... -- PATHS`), or restore first.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
list=.git/device-hidden.txt exclude=.git/info/exclude
case "${1:-status}" in
  hide)
    [[ -s $list ]] && { echo "already hidden: $(wc -l < $list) files (tools/device_tree.sh restore)"; exit 0; }
    git ls-files 'reports/data/*.nsys-rep' 'reports/data/*.sqlite.gz' > $list
    [[ -s $list ]] || { echo "nothing to hide"; rm -f $list; exit 0; }
    xargs -a $list git rm -q --cached --
    mkdir -p .git/info; sed 's|^|/|' $list >> $exclude
    echo "hidden: $(wc -l < $list) files; what travels: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes" ;;
  restore)
    [[ -s $list ]] || { echo "nothing hidden"; exit 0; }
    xargs -a $list git reset -q --
    grep -vxF -f <(sed 's|^|/|' $list) $exclude > $exclude.new || true; mv $exclude.new $exclude
    rm $list; echo "restored; git status:"; git status --short | head ;;
  status)
    [[ -s $list ]] && echo "hidden: $(wc -l < $list) files" || echo "nothing hidden"
    echo "tracked: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes (the device takes 67108864)" ;;
  *) echo "usage: $0 hide|restore|status" >&2; exit 2 ;;
esac
