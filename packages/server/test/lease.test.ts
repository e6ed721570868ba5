// The lease guard, proven with a real process: an attempt whose process is stopped (SIGSTOP) while it holds a key
// loses the key within about the lease, because Postgres ends its idle transaction; a second attempt then executes,
// and the stopped one, continued, cannot commit. Under both protocols. And under the lock protocol, a handler busy
// in a statement is not idle: it keeps its key however long the statement runs.
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { createInterface } from 'node:readline'
import type { TestDatabase } from '@oncely/test-support'
import { countingProxy, spawnTsx } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest'
import type { ExecutionContext } from '../src/index.js'
import {
  engineFor,
  freshKey,
  paymentsFor,
  payRequest,
  reservation,
  running,
  setupDatabase,
  sleep,
} from './helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('lease')
})
afterAll(() => db.drop())

const LEASE_MS = 1_000

function startHolder(key: string): { child: ChildProcessWithoutNullStreams; lines: AsyncIterator<string> } {
  const child = spawnTsx(new URL('fixtures/stalled-holder.ts', import.meta.url), [], {
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

describe(`the lease guard (reservation: '${reservation}')`, () => {
  it('frees the key of a holder stopped with SIGSTOP within about the lease; continued, it cannot commit', async () => {
    const key = freshKey()
    const { child, lines } = startHolder(key)
    expect((await lines.next()).value).toBe('holding')
    child.kill('SIGSTOP')
    const stoppedAt = Date.now()

    const { engine } = engineFor(db.pool, { leaseMs: LEASE_MS, replayCache: false })
    const winner = await engine.execute(payRequest('stalled', key, { wait: { timeoutMs: 20 * LEASE_MS } }))
    const waitedMs = Date.now() - stoppedAt
    expect(winner).toMatchObject({ kind: 'executed' })
    console.info(
      `reservation ${reservation}: the second attempt ran ${waitedMs} ms after the holder stopped (lease ${LEASE_MS} ms)`,
    )

    child.kill('SIGCONT')
    child.stdin.write('go on\n')
    const late = JSON.parse((await lines.next()).value as string)
    // It lost its key: it answers with the winner's response (or 409 if it asked before the winner finished).
    expect(late.kind).toBe('replayed')
    expect(late.summary.fencedOut).toBe(true)
    expect(await paymentsFor(db.pool, `${key}-stalled`)).toBe(0)
    expect(await paymentsFor(db.pool, key)).toBe(1)
  })

  it.runIf(reservation === 'lock')(
    'keeps the key of a handler busy in a statement longer than the lease',
    async () => {
      // A lease of a second: the transaction is idle for a moment before and after the statement, and a stall there
      // as long as the lease would end it, as it should.
      const { engine } = engineFor(db.pool, { leaseMs: 1_000 })
      const key = freshKey()
      const held = running(async (ctx: ExecutionContext) => {
        await ctx.tx.query('SELECT pg_sleep(4)')
        return { status: 201, body: { slept: true } }
      })
      const busy = engine.execute(payRequest('busy', key, { handler: held.handler }))
      // Past two leases, with over a second left of the statement: a busy machine's stall cannot end it first. And
      // not before it holds the key, however long that takes.
      await Promise.all([sleep(2_200), held.started])
      expect(await engine.execute(payRequest('busy', key))).toMatchObject({ kind: 'in_progress' })
      expect(await busy).toMatchObject({ kind: 'executed' })
      expect(await paymentsFor(db.pool, key)).toBe(0)
    },
  )

  // Regression: each keep-alive tick queued another statement behind the handler's, so a statement of a few leases
  // piled them up on the connection (and node-postgres warns that such queueing is going away in pg 9).
  it.runIf(reservation === 'lock')(
    'sends one keep-alive at a time: none piles up behind a handler statement longer than the lease',
    async () => {
      const proxy = await countingProxy(db.url)
      const pool = new pg.Pool({ connectionString: proxy.url, max: 2 })
      pool.on('error', () => {})
      try {
        const leaseMs = 1_000 // a stall of a lease while the transaction is idle would end it
        const { engine } = engineFor(pool, { leaseMs, replayCache: false })
        const statementsOf = async (seconds: number) => {
          const before = proxy.counts().statements
          const result = await engine.execute(
            payRequest('busy', freshKey(), {
              handler: async (ctx) => {
                await ctx.tx.query('SELECT pg_sleep($1)', [seconds])
                return { status: 201, body: { slept: seconds } }
              },
            }),
          )
          expect(result).toMatchObject({ kind: 'executed' })
          return proxy.counts().statements - before
        }
        await statementsOf(0) // prepares the engine's statements on the connection
        const quick = await statementsOf(0)
        // Three leases: a keep-alive is due every lease / 3, so nine would have queued.
        const busy = await statementsOf((3 * leaseMs) / 1000)
        // One waits behind the statement, and one more may go out between its end and the completion.
        expect(busy - quick).toBeLessThanOrEqual(2)
      } finally {
        await pool.end()
        await proxy.close()
      }
    },
  )
})
