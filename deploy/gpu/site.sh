# Sourced by check.sh and measure.sh (not run): the bundle in .whl/ installed into $SITE, and conveyor.*
# mapped onto this tree through a tree of links in $LINKS, both put in front of PYTHONPATH. The caller
# sets PY, LOCAL (1: this environment's packages, no bundle), REPO, SETUP (a log file), START (the
# script's start, epoch seconds) and BUDGET (its seconds in all), and defines row NAME STATUS DETAIL.
SITE=/tmp/conveyor-site
LINKS=/tmp/conveyor-links

# The time budget: seconds since START, seconds left, and ``cap SECONDS RESERVE``: SECONDS, or less
# so that RESERVE seconds stay for what follows (never under 10).
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
cap() { local l; l=$(( $(left) - $2 )); [ "$l" -lt "$1" ] && echo $(( l > 10 ? l : 10 )) || echo "$1"; }

install_site() {
  # 1. The bundle, into a folder of its own: it shadows the machine's copies for this process tree only.
  if [ "$LOCAL" = 1 ]; then
    export PYTHONPATH=$LINKS${PYTHONPATH:+:$PYTHONPATH}
    row "install the bundle" SKIP "CHECK_LOCAL=1: this environment's packages ($($PY -V 2>&1))"
  elif ! ls .whl/*.whl > /dev/null 2>&1; then
    row "install the bundle" FAIL "no .whl/*.whl: run 'bash deploy/gpu/bundle.sh' here and carry .whl"
  else
    rm -rf "$SITE"
    local t0
    t0=$(date +%s)
    if timeout -k 5 "$(cap 120 300)" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
         --disable-pip-version-check --target "$SITE" .whl/*.whl >> "$SETUP" 2>&1; then
      row "install the bundle" PASS "$(ls .whl/*.whl | wc -l) wheels ($(du -sm .whl | cut -f1) MiB) in $(( $(date +%s) - t0 )) s"
    else
      row "install the bundle" FAIL "pip install --target failed (setup.log)"
    fi
    export PYTHONPATH=$SITE:$LINKS${PYTHONPATH:+:$PYTHONPATH}
  fi
  # 2. conveyor.* -> this tree's folders: the links deploy/link_tree.py makes (as the build backend does in build/src), alone on the path.
  rm -rf "$LINKS" && "$PY" "$REPO/deploy/link_tree.py" "$LINKS"
}
