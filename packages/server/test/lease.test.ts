// The lease guard, proven with a real process: an attempt whose process is stopped (SIGSTOP) while it holds a key
// loses the key within about the lease, because Postgres ends its idle transaction; a second attempt then executes,
// and the stopped one, continued, cannot commit. Under both protocols. And under the lock protocol, a handler busy
// in a statement is not idle: it keeps its key however long the statement runs.
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { createInterface } from 'node:readline'
import type { TestDatabase } from '@oncely/test-support'
import { spawnTsx } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest'
import { engineFor, freshKey, paymentsFor, payRequest, reservation, setupDatabase, sleep } from './helpers.js'

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
      const { engine } = engineFor(db.pool, { leaseMs: 300 })
      const key = freshKey()
      const busy = engine.execute(
        payRequest('busy', key, {
          handler: async (ctx) => {
            await ctx.tx.query('SELECT pg_sleep(1)')
            return { status: 201, body: { slept: true } }
          },
        }),
      )
      await sleep(700)
      expect(await engine.execute(payRequest('busy', key))).toMatchObject({ kind: 'in_progress' })
      expect(await busy).toMatchObject({ kind: 'executed' })
      expect(await paymentsFor(db.pool, key)).toBe(0)
    },
  )
})
