#!/usr/bin/env bash
# The team server's read benchmark: the hot-functions page of one build with 50,000
# functions and 1,000 runs, on SQLite and on a PostgreSQL 15 started here for the purpose.
# See bench/README.md ("Team server").
#
#   bench/server.sh                       # both databases
#   BENCH_DB=sqlite bench/server.sh       # one of them (sqlite or postgres)
#   BENCH_FUNCTIONS=5000 BENCH_RUNS=100 bench/server.sh
#
# The SQLite database is kept in target/bench/server/ and reused when it holds the runs
# already (filling it is most of the time); the PostgreSQL cluster is made anew and removed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cd "$root"

functions=${BENCH_FUNCTIONS:-50000}
runs=${BENCH_RUNS:-1000}
called=${BENCH_CALLED:-0.2}
which=${BENCH_DB:-sqlite,postgres}
pg=/usr/lib/postgresql/15/bin
target=${CARGO_TARGET_DIR:-target}
out=$target/bench/server
mkdir -p "$out"

echo "bench: building the benchmark (cargo build --release -p fnscope-server --example server_bench)" >&2
cargo build --release -p fnscope-server --example server_bench >&2
bin=$target/release/examples/server_bench
args=(--functions "$functions" --runs "$runs" --called "$called")

if [[ ,$which, == *,sqlite,* ]]; then
    echo "== SQLite ($functions functions, $runs runs)"
    "$bin" --db "sqlite:$out/bench-$functions-$runs.db" "${args[@]}"
fi

if [[ ,$which, == *,postgres,* ]]; then
    if [ ! -x "$pg/initdb" ]; then
        echo "bench/server.sh: $pg/initdb not found: apt-get install -y postgresql-15" >&2
        exit 1
    fi
    dir=$(mktemp -d /tmp/fnscope-bench-pg.XXXXXX)
    as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi; }
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    as_pg "$pg/initdb -D $dir/data -A trust -U fnscope --no-sync" >/dev/null
    # Durable writes stay on (no fsync=off): the figures are those of a real installation.
    as_pg "$pg/pg_ctl -D $dir/data -l $dir/log -o '-k $dir -p $port -c listen_addresses=127.0.0.1' -w start" >/dev/null
    trap 'as_pg "$pg/pg_ctl -D $dir/data -m fast stop" >/dev/null; rm -rf "$dir"' EXIT
    as_pg "$pg/createdb -h 127.0.0.1 -p $port -U fnscope bench"
    echo "== PostgreSQL 15 ($functions functions, $runs runs)"
    "$bin" --db "postgres://fnscope@127.0.0.1:$port/bench" "${args[@]}"
fi
