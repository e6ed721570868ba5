// @node-idempotency publishes storage adapters for memory and Redis only (no Postgres adapter on npm). This is the
// straightforward Postgres port of its Redis adapter (SET NX PX / SET PX / GET), so the peer can be measured on the
// same database as the business transaction. It runs outside the business transaction, as the library requires.
import type { StorageAdapter } from '@node-idempotency/storage'
import type pg from 'pg'

export const NODE_IDEMPOTENCY_SCHEMA = `CREATE TABLE IF NOT EXISTS node_idempotency (
  key        text        PRIMARY KEY,
  value      text        NOT NULL,
  expires_at timestamptz NOT NULL
)`

const ttlInterval = "($3::float8 * interval '1 millisecond')"

export class PostgresStorageAdapter implements StorageAdapter {
  readonly #pool: pg.Pool

  constructor(pool: pg.Pool) {
    this.#pool = pool
  }

  async setIfNotExists(key: string, val: string, { ttl }: { ttl?: number } = {}): Promise<boolean> {
    const { rowCount } = await this.#pool.query(
      `INSERT INTO node_idempotency AS n (key, value, expires_at) VALUES ($1, $2, now() + ${ttlInterval})
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
WHERE n.expires_at <= now()`,
      [key, val, ttl ?? 86_400_000],
    )
    return rowCount === 1
  }

  async set(key: string, val: string, { ttl }: { ttl?: number }): Promise<void> {
    await this.#pool.query(
      `INSERT INTO node_idempotency (key, value, expires_at) VALUES ($1, $2, now() + ${ttlInterval})
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at`,
      [key, val, ttl ?? 86_400_000],
    )
  }

  async get(key: string): Promise<string | undefined> {
    const { rows } = await this.#pool.query<{ value: string }>(
      'SELECT value FROM node_idempotency WHERE key = $1 AND expires_at > now()',
      [key],
    )
    return rows[0]?.value
  }
}
