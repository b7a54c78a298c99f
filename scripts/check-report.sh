#!/usr/bin/env bash
# Renders every report.html under a results folder in headless Chromium (Debian's
# `chromium` package) and fails if the browser logs a console error or if the rendered
# page does not hold every plot of the file (each inline <svg>, none empty).
#
#   scripts/check-report.sh results/mixed
#
# Exit status: 0 all good, 1 a report failed, 2 no Chromium or no report found.
set -euo pipefail
dir=${1:?usage: scripts/check-report.sh RESULTS_DIR}
chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$chrome" ]; then
  echo "check-report: no Chromium (install Debian's chromium package)" >&2
  exit 2
fi
mapfile -t reports < <(find "$dir" -name report.html | sort)
if [ "${#reports[@]}" -eq 0 ]; then
  echo "check-report: no report.html under $dir" >&2
  exit 2
fi
status=0
for f in "${reports[@]}"; do
  log=$(mktemp)
  dom=$(timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
    --virtual-time-budget=5000 --dump-dom "file://$(realpath "$f")" 2>"$log")
  in_file=$(grep -o '<svg' "$f" | wc -l)
  in_dom=$(printf '%s' "$dom" | grep -o '<svg' | wc -l)
  empty=$(printf '%s' "$dom" | grep -c '<svg[^>]*width="0"' || true)
  ok=1
  if grep -E 'CONSOLE|Uncaught' "$log" >/dev/null; then
    echo "$f: console errors:" >&2
    grep -E 'CONSOLE|Uncaught' "$log" >&2
    ok=0
  fi
  if [ "$in_file" -eq 0 ] || [ "$in_file" -ne "$in_dom" ] || [ "$empty" -ne 0 ]; then
    echo "$f: $in_file plots in the file, $in_dom rendered ($empty empty)" >&2
    ok=0
  fi
  if [ "$ok" -eq 1 ]; then
    echo "$f: $in_dom plots rendered, no console error"
  else
    status=1
  fi
  rm -f "$log"
done
exit $status
