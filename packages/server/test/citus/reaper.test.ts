// The reaper on a key table distributed by Citus: the engine's own statement (a ctid batch with FOR UPDATE SKIP
// LOCKED) is refused through the coordinator, since it spans shards; engine.reap() runs it on every shard instead,
// each in a transaction of its own on the node holding it, and keeps its bounded batches and SKIP LOCKED.
import type { TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { tableNames } from '../../src/store/identifiers.js'
import { reap } from '../../src/store/queries.js'
import { engineFor, setupDatabase } from '../helpers.js'

let db: TestDatabase
/** One tenant per shard of the key table (4 shards, two per worker). */
let tenants: string[]
beforeAll(async () => {
  db = await setupDatabase('citus_reaper')
  const { rows } = await db.pool.query<{ tenant: string }>(
    `SELECT DISTINCT ON (shard) tenant FROM (
       SELECT 'tenant' || g AS tenant,
         get_shard_id_for_distribution_column('oncely.idempotency_keys', 'tenant' || g) AS shard
       FROM generate_series(1, 200) g) t
     ORDER BY shard, tenant`,
  )
  tenants = rows.map((r) => r.tenant)
})
afterAll(() => db.drop())

/** `expired` expired and `live` live key records for each tenant. */
async function fill(expired: number, live: number) {
  await db.pool.query('TRUNCATE oncely.idempotency_keys')
  await db.pool.query(
    `INSERT INTO oncely.idempotency_keys (scope, operation, key, fingerprint, status, expires_at)
     SELECT t, 'o', 'k' || g, 'f', 'succeeded',
       CASE WHEN g <= $2::int THEN now() - interval '1 second' ELSE now() + interval '1 hour' END
     FROM unnest($1::text[]) t, generate_series(1, $2::int + $3::int) g`,
    [tenants, expired, live],
  )
}

const remaining = async () =>
  (
    await db.pool.query<{ expired: number; live: number }>(
      `SELECT count(*) FILTER (WHERE expires_at <= now())::int AS expired,
         count(*) FILTER (WHERE expires_at > now())::int AS live FROM oncely.idempotency_keys`,
    )
  ).rows[0]

describe('the reaper on a key table distributed by Citus', () => {
  it('has a tenant on every shard, and shards on both workers', async () => {
    expect(tenants).toHaveLength(4)
    const { rows } = await db.pool.query(
      `SELECT DISTINCT nodeport FROM citus_shards WHERE table_name = 'oncely.idempotency_keys'::regclass`,
    )
    expect(rows).toHaveLength(2)
  })

  it("refuses the engine's single statement through the coordinator (a multi-shard FOR UPDATE)", async () => {
    await fill(5, 0)
    const { text, values } = reap(tableNames('oncely', 'idempotency_keys'), 100)
    await expect(db.pool.query(text, [...values])).rejects.toMatchObject({
      message: 'could not run distributed query with FOR UPDATE/SHARE commands',
    })
  })

  it('engine.reap() deletes the expired records of every shard, in batches per shard, and leaves live ones', async () => {
    await fill(30, 3)
    const { engine } = engineFor(db.pool)
    // One batch of 10 on each of the 4 shards.
    expect(await engine.reap({ batchSize: 10, maxBatches: 1 })).toBe(40)
    expect(await remaining()).toEqual({ expired: 80, live: 12 })
    // Several reapers at once delete every expired record exactly once.
    const counts = await Promise.all([engine.reap({ batchSize: 7 }), engine.reap({ batchSize: 7 })])
    expect(counts[0] + counts[1]).toBe(80)
    expect(await remaining()).toEqual({ expired: 0, live: 12 })
    expect(await engine.reap()).toBe(0)
  })

  it('skips a record a transaction holds (a reservation reviving an expired key) instead of waiting for it', async () => {
    await fill(2, 0)
    const holder = await db.pool.connect()
    try {
      await holder.query('BEGIN')
      await holder.query(
        `SELECT 1 FROM oncely.idempotency_keys WHERE scope = $1 AND operation = 'o' AND key = 'k1' FOR UPDATE`,
        [tenants[0]],
      )
      const { engine } = engineFor(db.pool)
      expect(await engine.reap()).toBe(7)
      expect(await remaining()).toEqual({ expired: 1, live: 0 })
    } finally {
      await holder.query('ROLLBACK')
      holder.release()
    }
    const { engine } = engineFor(db.pool)
    expect(await engine.reap()).toBe(1)
  })
})
