// Worker faults on a Citus cluster of this file's own (a fault must not reach other files' tests): a tenant is served
// while another tenant's worker is down, its requests fail closed while its own worker is down and run once it is
// back, and a worker crashing mid-request leaves no effect behind and the retry runs once. Per protocol.
import { type CitusCluster, startCitusCluster, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
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

let cluster: CitusCluster
let db: TestDatabase
/** A tenant whose shards are on worker1, and one whose shards are on worker2. */
const tenants: Record<'worker1' | 'worker2', string> = { worker1: '', worker2: '' }
beforeAll(async () => {
  cluster = await startCitusCluster()
  db = await setupCitusDatabase('citus_faults', {}, cluster.url)
  const byPort = new Map(cluster.nodes.map((n) => [`127.0.0.1:${n.port}`, n.name]))
  for (let i = 0; !(tenants.worker1 && tenants.worker2); i++) {
    const name = byPort.get((await shardOf(db.pool, 'oncely.idempotency_keys', `tenant${i}`)).node)
    if ((name === 'worker1' || name === 'worker2') && !tenants[name]) tenants[name] = `tenant${i}`
  }
})
afterAll(async () => {
  await db?.drop()
  await cluster?.stop()
})

/** Executes until the store answers (a pooled connection may first meet the node's earlier failure). */
async function settled(run: () => ReturnType<ReturnType<typeof engineFor>['engine']['execute']>) {
  for (let attempt = 0; ; attempt++) {
    const outcome = await run()
    if (outcome.kind !== 'unavailable' || attempt >= 20) return outcome
    await sleep(250)
  }
}

describe(`worker faults (reservation: '${reservation}')`, () => {
  it("serves a tenant while another tenant's worker is down; that tenant fails closed until its worker is back", async () => {
    const { engine } = engineFor(db.pool, { replayCache: false })
    const onWorker1 = freshKey()
    const onWorker2 = freshKey()
    await cluster.stopNode('worker2')
    try {
      expect(await settled(() => engine.execute(payRequest(tenants.worker1, onWorker1)))).toMatchObject({
        kind: 'executed',
      })
      let ran = false
      const down = await engine.execute(
        payRequest(tenants.worker2, onWorker2, {
          handler: async () => {
            ran = true
            return { status: 201 }
          },
        }),
      )
      expect(down.kind).toBe('unavailable')
      expect(ran).toBe(false)
    } finally {
      await cluster.startNode('worker2')
    }
    expect(await settled(() => engine.execute(payRequest(tenants.worker2, onWorker2)))).toMatchObject({
      kind: 'executed',
    })
    expect(await paymentsFor(db.pool, onWorker1)).toBe(1)
    expect(await paymentsFor(db.pool, onWorker2)).toBe(1)
  })

  it("leaves nothing behind when the tenant's worker crashes mid-request, and the retry runs once", async () => {
    const { engine } = engineFor(db.pool, { replayCache: false, leaseMs: 1_000 })
    const key = freshKey()
    const inHandler = gate()
    const crashed = gate()
    const first = engine.execute(
      payRequest(tenants.worker1, key, {
        handler: async (ctx) => {
          await ctx.tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, 100)', [
            ctx.scope,
            key,
          ])
          inHandler.open()
          await crashed.opened
          return { status: 201 }
        },
      }),
    )
    await inHandler.opened
    await cluster.restart('worker1', 'crash')
    crashed.open()
    const outcome = await first
    expect(outcome.kind).not.toBe('executed')
    expect(await paymentsFor(db.pool, key)).toBe(0)
    // The retry: at once under the lock protocol, once the lease ran out under the row protocol.
    const retry = await settled(() =>
      engine.execute(payRequest(tenants.worker1, key, { wait: { timeoutMs: 10_000 } })),
    )
    expect(retry).toMatchObject({ kind: 'executed' })
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })
})
