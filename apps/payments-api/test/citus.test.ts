// The demo on a real Citus cluster with its one setting (DATABASE_DISTRIBUTION=citus: prepareDatabase distributes
// its tables by tenant): payments are booked once per key and replayed, each tenant's payment, outbox event and key
// record live on the node holding the tenant, and a request commits there alone.
import { randomUUID } from 'node:crypto'
import {
  type CitusCluster,
  type CitusTestDatabase,
  createCitusTestDatabase,
  requireCitus,
  startCitusCluster,
} from '@oncely/test-support'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { buildApp } from '../src/app.js'
import { prepareDatabase } from '../src/database.js'
import { createProvider } from '../src/provider.js'
import { count, pay } from './support/app.js'

describe.skipIf(!requireCitus('the demo on Citus'))('the payments API on a Citus cluster', () => {
  let cluster: CitusCluster
  let db: CitusTestDatabase
  let app: FastifyInstance
  const commands: { command: string; node: string }[] = []
  let logged: pg.Pool
  beforeAll(async () => {
    cluster = await startCitusCluster()
    db = await createCitusTestDatabase('payments_api_citus', { cluster: cluster.url })
    // Instances starting at once each distribute the tables: they take turns, and the second finds nothing to do.
    await Promise.all([
      prepareDatabase(db.pool, { distribution: 'citus' }),
      prepareDatabase(db.pool, { distribution: 'citus' }),
    ])
    // The app's pool logs what the coordinator sends to the workers.
    logged = new pg.Pool({ connectionString: db.url, max: 10, options: '-c citus.log_remote_commands=on' })
    logged.on('error', () => {})
    logged.on('connect', (client) =>
      client.on('notice', (n: { message?: string; detail?: string }) => {
        const command = /^issuing (.*)$/s.exec(n.message ?? '')?.[1]
        const node = /on server \S+@(\S+:\d+)/.exec(n.detail ?? '')?.[1]
        if (command && node) commands.push({ command, node })
      }),
    )
    app = await buildApp({ pool: logged, provider: createProvider({ pool: db.pool }), webRoot: false })
  })
  afterAll(async () => {
    await app?.close()
    await logged?.end()
    await db?.drop()
    await cluster?.stop()
  })

  it('distributes payments, outbox and the key table by tenant in one group; provider_charges stays on the coordinator', async () => {
    const { rows } = await db.pool.query(
      'SELECT table_name::text AS name, distribution_column AS column, colocation_id FROM citus_tables ORDER BY 1',
    )
    expect(rows.map(({ name, column }) => ({ name, column }))).toEqual([
      { name: 'oncely.idempotency_keys', column: 'scope' },
      { name: 'oncely.outbox', column: 'scope' },
      { name: 'outbox', column: 'tenant_id' },
      { name: 'payments', column: 'tenant_id' },
    ])
    expect(new Set(rows.map((r) => r.colocation_id)).size).toBe(1)
  })

  it("books a payment once per key, replays it, and commits each request on its tenant's node alone", async () => {
    for (const tenant of ['acme', 'globex', 'initech', 'umbrella']) {
      const key = randomUUID()
      await pay(app, { amount: 1250, currency: 'eur' }, { tenant, key: randomUUID() }) // warm
      commands.length = 0
      const first = await pay(app, { amount: 1250, currency: 'eur' }, { tenant, key })
      expect(first.statusCode).toBe(201)
      const { rows } = await db.pool.query(
        `SELECT nodename || ':' || nodeport AS node FROM citus_shards
         WHERE shardid = get_shard_id_for_distribution_column('payments', $1::text)`,
        [tenant],
      )
      expect(new Set(commands.map((c) => c.node))).toEqual(new Set([rows[0].node]))
      expect(commands.filter((c) => c.command.startsWith('PREPARE TRANSACTION'))).toEqual([])
      const replay = await pay(app, { amount: 1250, currency: 'eur' }, { tenant, key })
      expect(replay.statusCode).toBe(201)
      expect(replay.body).toBe(first.body)
      const paymentId = first.json().id
      expect(await count(db.pool, 'payments', ['idempotency_key', key])).toBe(1)
      expect(await count(db.pool, 'outbox', ['aggregate_id', paymentId])).toBe(1)
      const read = await app.inject({
        method: 'GET',
        url: `/v1/payments/${paymentId}`,
        headers: { authorization: `Bearer ${tenant}` },
      })
      expect(read.statusCode).toBe(200)
    }
  })
})
