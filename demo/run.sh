#!/bin/sh
# Builds the demo program and shows what fnscope records of it: the hot-function table and
# what was traced. Uses $FNSCOPE if set (a path or a command on PATH), else the release build
# in this repository (cargo build --release).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

# A relative $FNSCOPE is taken relative to where the script was started, before the cd below.
fnscope=${FNSCOPE:-$root/target/release/fnscope}
case $fnscope in
    */*) fnscope=$(cd "$(dirname "$fnscope")" 2>/dev/null && pwd)/$(basename "$fnscope") || true ;;
    *) fnscope=$(command -v "$fnscope" || true) ;;
esac
if [ ! -x "$fnscope" ]; then
    echo "demo/run.sh: no fnscope at ${FNSCOPE:-target/release/fnscope}." >&2
    echo "Build it with 'cargo build --release' in $root, or set FNSCOPE to the fnscope binary." >&2
    exit 1
fi

cd "$root"
mkdir -p target/demo
gcc -O2 -g -pthread -o target/demo/demo demo/demo.c
rm -rf target/demo/trace

"$fnscope" record -o target/demo/trace -- target/demo/demo
echo
"$fnscope" report -i target/demo/trace --top 15
echo
"$fnscope" info -i target/demo/trace
