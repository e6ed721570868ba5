#!/usr/bin/env bash
# Statement-cost experiment: pgbench on a scratch database, each script alternated with the baseline (A B A B).
# usage: bash bench/sql/run.sh [postgres-url-of-a-server] [seconds-per-run]
# Prints transactions per second per script and round; divide by the neighbouring baseline for the ratio.
set -euo pipefail
server=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}}
seconds=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
db="oncely_bench_sql_$$"
psql -q "$server" -c "CREATE DATABASE $db"
url="${server%/*}/$db"
trap 'psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
psql -q "$url" -f "$here/setup.sql" >/dev/null
tps() { pgbench -n -M extended -c "$1" -j "$(( $1 < 2 ? 1 : 2 ))" -T "$seconds" -f "$here/$2.sql" "$url" 2>/dev/null | awk '/^tps/ {print $3}'; }
for clients in 1 10; do
  for round in 1 2; do
    for script in ${SCRIPTS:-first-two-commits first-async-reserve first-one-commit first-lock-insert replay-select}; do
      base=$(tps "$clients" baseline)
      other=$(tps "$clients" "$script")
      echo "clients=$clients round=$round $script tps=$other baseline_tps=$base ratio=$(awk "BEGIN {printf \"%.2f\", $other / $base}")"
    done
  done
done
