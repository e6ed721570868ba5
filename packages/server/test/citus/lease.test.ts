// The Postgres-enforced lease on a Citus cluster. Under the row protocol the guard is armed on the coordinator's
// session (its statement reads no table); when it ends that session, Citus closes the session's connections to the
// workers and their part of the transaction rolls back. Under the lock protocol it is armed with the key's lock, by
// the statement Citus routes to the worker holding the key's shard: there the worker ends the transaction that holds
// the lock. Either way a holder stopped while alive loses its key within about the lease, and cannot commit after.
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { createInterface } from 'node:readline'
import { spawnTsx, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest'
import type { ExecutionContext } from '../../src/index.js'
import {
  engineFor,
  freshKey,
  paymentsFor,
  payRequest,
  reservation,
  running,
  setupDatabase,
  sleep,
} from '../helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('citus_lease')
})
afterAll(() => db.drop())

const LEASE_MS = 1_000

function startHolder(key: string): { child: ChildProcessWithoutNullStreams; lines: AsyncIterator<string> } {
  const child = spawnTsx(new URL('../fixtures/stalled-holder.ts', import.meta.url), [], {
    env: { ...process.env, DATABASE_URL: db.url, LEASE_MS: String(LEASE_MS), KEY: key },
    stdio: 'pipe',
  })
  let stderr = ''
  child.stderr.on('data', (chunk) => {
    stderr += chunk
  })
  onTestFinished(() => {
    child.kill('SIGKILL')
    if (child.exitCode !== null && child.exitCode !== 0) console.error(stderr)
  })
  return { child, lines: createInterface({ input: child.stdout })[Symbol.asyncIterator]() }
}

/** A statement that keeps the tenant's worker busy for `seconds`: routed to the tenant's shard, so it runs there. */
const busyOnTheKeysWorker = `SELECT pg_sleep($2) FROM (SELECT 1) AS one
  LEFT JOIN (SELECT 1 FROM payments WHERE tenant = $1 LIMIT 1) AS p ON true`

describe(`the lease guard on Citus (reservation: '${reservation}')`, () => {
  it('frees the key of a holder stopped with SIGSTOP within about the lease; continued, it cannot commit', async () => {
    const key = freshKey()
    const { child, lines } = startHolder(key)
    expect((await lines.next()).value).toBe('holding')
    child.kill('SIGSTOP')
    const stoppedAt = Date.now()

    const { engine } = engineFor(db.pool, { leaseMs: LEASE_MS, replayCache: false })
    const winner = await engine.execute(payRequest('stalled', key, { wait: { timeoutMs: 20 * LEASE_MS } }))
    expect(winner).toMatchObject({ kind: 'executed' })
    console.info(
      `reservation ${reservation} on Citus: the second attempt ran ${Date.now() - stoppedAt} ms after the holder stopped (lease ${LEASE_MS} ms)`,
    )

    child.kill('SIGCONT')
    child.stdin.write('go on\n')
    const late = JSON.parse((await lines.next()).value as string)
    expect(late.kind).toBe('replayed')
    expect(late.summary.fencedOut).toBe(true)
    expect(await paymentsFor(db.pool, `${key}-stalled`)).toBe(0)
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it.runIf(reservation === 'lock')(
    "keeps the key of a handler busy in a statement on the key's worker longer than the lease",
    async () => {
      const { engine } = engineFor(db.pool, { leaseMs: 300 })
      const key = freshKey()
      const held = running(async (ctx: ExecutionContext) => {
        await ctx.tx.query(busyOnTheKeysWorker, [ctx.scope, 1])
        return { status: 201, body: { slept: true } }
      })
      const busy = engine.execute(payRequest('busy', key, { handler: held.handler }))
      await Promise.all([sleep(700), held.started]) // past two leases, and not before it holds the key
      expect(await engine.execute(payRequest('busy', key))).toMatchObject({ kind: 'in_progress' })
      expect(await busy).toMatchObject({ kind: 'executed' })
    },
  )

  it.runIf(reservation === 'lock')(
    "lets the key go when the busy statement runs on the coordinator only: the key's worker sat idle past the lease",
    async () => {
      const { engine } = engineFor(db.pool, { leaseMs: 300, replayCache: false })
      const key = freshKey()
      const held = running(async (ctx: ExecutionContext) => {
        await ctx.tx.query('SELECT pg_sleep(1)') // no table: Citus runs it on the coordinator
        return { status: 201, body: { by: 'busy' } }
      })
      const busy = engine.execute(payRequest('busy', key, { handler: held.handler }))
      await Promise.all([sleep(700), held.started]) // past two leases, and not before it holds the key
      const second = await engine.execute(payRequest('busy', key))
      expect(second).toMatchObject({ kind: 'executed' })
      // The first, done sleeping, finds its worker's part of the transaction gone and answers with the winner's.
      expect(await busy).toMatchObject({ kind: 'replayed', fencedOut: true })
      expect(await paymentsFor(db.pool, key)).toBe(1)
    },
  )
})
