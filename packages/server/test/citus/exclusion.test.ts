// Exclusion on a Citus cluster, with instances connected to different nodes: the coordinator, and each worker (Citus
// lets any node with its metadata run distributed queries). The lock protocol's advisory lock is taken by a statement
// Citus routes to the node holding the key's shard, so every attempt on a key takes it on that one node, whichever
// node its instance is connected to; the row protocol's reservation is the key's row, on that shard too.
import type { CitusTestDatabase } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Outcome } from '../../src/index.js'
import {
  engineFor,
  freshKey,
  gate,
  paymentsFor,
  payRequest,
  reservation,
  setupCitusDatabase,
  sleep,
} from '../helpers.js'
import { shardOf } from './plans.js'

let db: CitusTestDatabase
/** A pool on each node's copy of the database, coordinator first. */
let pools: { name: string; pool: pg.Pool }[]
beforeAll(async () => {
  db = await setupCitusDatabase('citus_exclusion')
  pools = db.nodeUrls.map(({ name, url }) => {
    const pool = new pg.Pool({ connectionString: url, max: 12 })
    pool.on('error', () => {})
    return { name, pool }
  })
})
afterAll(async () => {
  await Promise.all(pools.map(({ pool }) => pool.end()))
  await db.drop()
})

/** Tenants whose key shard is on each worker (so a worker is both the lock's node and not, across the tenants). */
async function tenantPerWorker(): Promise<string[]> {
  const found = new Map<string, string>()
  for (let i = 0; found.size < 2; i++) {
    const { node } = await shardOf(db.pool, 'oncely.idempotency_keys', `tenant${i}`)
    if (!found.has(node)) found.set(node, `tenant${i}`)
  }
  return [...found.values()]
}

describe(`exclusion across the coordinator and the workers (reservation: '${reservation}')`, () => {
  it('runs the handler once for 36 concurrent attempts on one key, spread over instances on all three nodes', async () => {
    const engines = pools.map(({ pool }) => engineFor(pool, { replayCache: false }).engine)
    for (const tenant of await tenantPerWorker()) {
      const key = freshKey()
      let runs = 0
      const outcomes: Outcome[] = await Promise.all(
        Array.from({ length: 36 }, (_, i) =>
          engines[i % engines.length]!.execute(
            payRequest(tenant, key, {
              handler: async (ctx) => {
                runs++
                await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 1)', [
                  tenant,
                  key,
                ])
                await sleep(20)
                return { status: 201, body: { runs } }
              },
              wait: { timeoutMs: 10_000 },
            }),
          ),
        ),
      )
      expect(runs).toBe(1)
      expect(await paymentsFor(db.pool, key)).toBe(1)
      expect(outcomes.filter((o) => o.kind === 'executed')).toHaveLength(1)
      expect(outcomes.filter((o) => o.kind !== 'executed' && o.kind !== 'replayed')).toEqual([])
    }
  })

  it('answers 409 through every node while an attempt through the coordinator holds the key, and peeks see it', async () => {
    const [first] = pools
    const holder = engineFor(first!.pool, { replayCache: false }).engine
    for (const tenant of await tenantPerWorker()) {
      const key = freshKey()
      const release = gate()
      const inHandler = gate()
      const held = holder.execute(
        payRequest(tenant, key, {
          handler: async () => {
            inHandler.open()
            await release.opened
            return { status: 201 }
          },
        }),
      )
      await inHandler.opened
      try {
        for (const { name, pool } of pools) {
          const { engine } = engineFor(pool, { replayCache: false })
          expect((await engine.execute(payRequest(tenant, key))).kind, name).toBe('in_progress')
          expect((await engine.peek(payRequest(tenant, key)))?.kind, name).toBe('in_progress')
        }
        if (reservation === 'lock') {
          // The lock is on the node holding the key's shard, and on no other. Only bigint advisory locks count
          // (objsubid 1, what pg_advisory_xact_lock(bigint) takes): Citus takes advisory locks of its own, its lock
          // class in objsubid (4 and up: shard metadata, shards, operations...), and an unfiltered count once found
          // one on the coordinator. The message lists every advisory lock the node had.
          const { node } = await shardOf(db.pool, 'oncely.idempotency_keys', tenant)
          for (const { name, url } of db.nodeUrls) {
            const client = new pg.Client({ connectionString: url })
            await client.connect()
            const { rows } = await client.query<{ objsubid: number; classid: number; objid: number }>(
              `SELECT objsubid, classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
            )
            await client.end()
            const port = new URL(url).port
            const ours = rows.filter((lock) => lock.objsubid === 1)
            expect(ours.length, `${name}, advisory locks ${JSON.stringify(rows)}`).toBe(
              node.endsWith(`:${port}`) ? 1 : 0,
            )
          }
        }
      } finally {
        release.open()
      }
      expect(await held).toMatchObject({ kind: 'executed' })
    }
  })
})
