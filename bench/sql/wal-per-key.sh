#!/usr/bin/env bash
# WAL written per new key in a key table of 1M rows, right after a checkpoint: random keys (UUID v4, what the client
# minted before) against time-ordered ones (UUID v7, what it mints now). A random key lands on a random page of the
# primary key's index, whose first change after a checkpoint is a full-page image in the WAL; time-ordered keys land
# on the index's right edge, a few pages written again and again.
# usage: bash bench/sql/wal-per-key.sh [postgres-url-of-a-server, as a superuser] [rows]
set -euo pipefail
server=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}}
rows=${2:-1000000}
db="oncely_wal_per_key_$$"
psql -q "$server" -c "CREATE DATABASE $db"
url="${server%/*}/$db"
trap 'psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
# The key table's shape (migration 001) with the columns that matter to its size.
psql -q "$url" <<'SQL'
CREATE TABLE keys (scope text NOT NULL, operation text NOT NULL, key text NOT NULL, fingerprint text NOT NULL,
  status text NOT NULL, response_body bytea, expires_at timestamptz NOT NULL, PRIMARY KEY (scope, operation, key));
CREATE INDEX ON keys (expires_at);
-- A UUID v7 as the client mints it: the milliseconds in the first 48 bits, the version nibble 7, the rest random.
CREATE FUNCTION uuid_v7(ms bigint) RETURNS text LANGUAGE sql AS $$
  SELECT (substr(h, 1, 12) || '7' || substr(h, 14, 3) || substr(h, 17))::uuid::text
  FROM (SELECT encode(overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send(ms) FROM 3) FROM 1 FOR 6), 'hex') AS h) x
$$;
SQL
# Then the random keys again with the WAL's full-page images compressed (wal_compression, a superuser's setting).
# The server's WAL is shared with whatever else runs on it, and a checkpoint in the middle of a measurement starts the
# full-page images over: a reading during which a checkpoint ran is discarded and measured again (up to 5 times).
checkpoints() { psql -qAt "$url" -c "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"; }
for kind in v4 v7 v4-zstd; do
  key="gen_random_uuid()::text"
  [ "$kind" = v7 ] && key="uuid_v7((extract(epoch FROM clock_timestamp()) * 1000)::bigint + g)"
  compression=off
  [ "$kind" = v4-zstd ] && compression=zstd
  for try in 1 2 3 4 5; do
    psql -q "$url" <<SQL
TRUNCATE keys;
INSERT INTO keys SELECT 'tenant', 'POST /v1/payments', gen_random_uuid()::text, md5(g::text), 'succeeded', '\x7b7d',
  now() + interval '1 day' FROM generate_series(1, $rows) g;
VACUUM ANALYZE keys;
CHECKPOINT;
SQL
    count=$(checkpoints)
    before=$(psql -qAt "$url" -c "SELECT pg_current_wal_insert_lsn()")
    for batch in $(seq 0 99); do
      PGOPTIONS="-c wal_compression=$compression" psql -q "$url" -c "INSERT INTO keys SELECT 'tenant', 'POST /v1/payments', $key, md5(g::text), 'succeeded', '\x7b7d',
        now() + interval '1 day' FROM generate_series($((batch * 100 + 1)), $((batch * 100 + 100))) g"
    done
    bytes=$(psql -qAt "$url" -c "SELECT round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$before') / 10000)")
    if [ "$(checkpoints)" = "$count" ]; then
      echo "$kind: $bytes WAL bytes per new key"
      break
    fi
    echo "$kind: a checkpoint ran during the measurement ($bytes bytes per key); measuring again" >&2
  done
done
