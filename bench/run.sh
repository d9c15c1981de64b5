#!/usr/bin/env bash
# The fnscope benchmark, in one command: builds fnscope in release mode, builds the workloads
# of bench/workloads into target/bench/, runs native, fnscope and uftrace on each of them,
# alternating, BENCH_RUNS times (default 5), and prints one Markdown table (also written to
# target/bench/results.md). See bench/README.md.
#
#   bench/run.sh                    # everything, 5 rounds
#   BENCH_RUNS=3 bench/run.sh       # 3 rounds
#   BENCH_ONLY=fib,python bench/run.sh
#
# Progress goes to stderr, the table to stdout: `bench/run.sh > table.md` keeps just the table.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cd "$root"

if ! command -v python3 >/dev/null 2>&1; then
    echo "bench/run.sh: python3 not found: install it (apt-get install -y python3)" >&2
    exit 1
fi

if [ -z "${FNSCOPE:-}" ]; then
    if ! command -v cargo >/dev/null 2>&1; then
        echo "bench/run.sh: cargo not found: install Rust (https://rustup.rs), or set FNSCOPE" \
             "to an fnscope binary" >&2
        exit 1
    fi
    echo "bench: building fnscope (cargo build --release -p fnscope-cli)" >&2
    cargo build --release -p fnscope-cli >&2
fi

exec python3 "$here/harness.py" "$@"
