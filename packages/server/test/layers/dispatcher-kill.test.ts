import type { TestDatabase } from '@oncely/test-support'
import { spawnTsx, waitFor } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createDispatcher, enqueue, type Publisher } from '../../src/outbox/index.js'
import { PRESENCE_CLASS } from '../../src/outbox/queries.js'
import { freshKey, setupDatabase } from '../helpers.js'

let db: TestDatabase
beforeAll(async () => {
  db = await setupDatabase('dispatcher_kill')
})
afterAll(() => db?.drop())

/** Presence locks held in this test's database (each test file has a database of its own). */
async function presenceLocks(): Promise<number> {
  const { rows } = await db.pool.query(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::oid AND objsubid = 2
       AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
    [PRESENCE_CLASS],
  )
  return rows[0].n
}

async function enqueueOne(topic: string): Promise<string> {
  const client = await db.pool.connect()
  try {
    await client.query('BEGIN')
    const id = await enqueue(client, { topic, payload: { n: 1 } })
    await client.query('COMMIT')
    return id
  } finally {
    client.release()
  }
}

const claimOf = async (id: string) =>
  (await db.pool.query('SELECT status, attempts, claimed_by FROM oncely.outbox WHERE id = $1', [id]))
    .rows[0] as { status: string; attempts: number; claimed_by: string | null }

/**
 * Starts the fixture's dispatcher in a child process and has it claim a new message (its publisher never returns).
 * Undefined when the claim names no claimant: Postgres grants the child's presence lock, and this test sees it, a
 * moment before the child's event loop reads the answer, and a poll round that runs in between claims without it.
 * Such a claim is freed by its lease alone, as designed for a dispatcher without a presence lock; the child is
 * stopped and its message deleted, and the caller tries again.
 */
async function claimInAChild() {
  const child = spawnTsx(new URL('fixtures/claim-then-die.ts', import.meta.url), [], {
    env: { ...process.env, DATABASE_URL: db.url },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  child.stderr.on('data', (chunk) => (stderr += chunk))
  const exited = new Promise<NodeJS.Signals | null>((resolve) =>
    child.on('exit', (_code, sig) => resolve(sig)),
  )
  try {
    await waitFor(`the child's presence lock (stderr: ${stderr})`, async () => (await presenceLocks()) === 1)
    const id = await enqueueOne(freshKey('killed'))
    await waitFor('the child to publish', () => stdout.includes(`publishing ${id}`))
    const claimed = await claimOf(id)
    expect(claimed).toMatchObject({ status: 'pending', attempts: 1 })
    if (claimed.claimed_by !== null) return { child, exited, id }
    child.kill('SIGKILL')
    await exited
    await db.pool.query('DELETE FROM oncely.outbox WHERE id = $1', [id])
    await waitFor(
      'the stopped child to let go of its presence lock',
      async () => (await presenceLocks()) === 0,
    )
    return undefined
  } catch (error) {
    child.kill('SIGKILL')
    throw error
  }
}

describe('a dispatcher that dies holding a claim', () => {
  it('frees its claim as soon as its session is gone, not when the one-minute lease runs out', async () => {
    let claimed: Awaited<ReturnType<typeof claimInAChild>>
    for (let tries = 0; tries < 3 && !claimed; tries++) claimed = await claimInAChild()
    if (!claimed) throw new Error('three children in a row claimed without naming their presence lock')
    const { child, exited, id } = claimed
    try {
      child.kill('SIGKILL')
      expect(await exited).toBe('SIGKILL')
      const killedAt = Date.now()
      const published: string[] = []
      const survivor = createDispatcher({
        pool: db.pool,
        leaseMs: 60_000,
        listen: false,
        publisher: { publish: async (message) => void published.push(message.id) },
      })
      // Postgres ends the dead process's backends when it notices the closed sockets: at once on loopback.
      await waitFor(
        'the survivor to take the claim over',
        async () => (await survivor.dispatchOnce()) > 0,
        20_000,
      )
      const delayMs = Date.now() - killedAt
      console.log(
        `a SIGKILLed dispatcher's claim was taken over ${delayMs} ms after the kill (lease: 60000 ms)`,
      )
      expect(published).toEqual([id])
      expect(await claimOf(id)).toEqual({ status: 'published', attempts: 2, claimed_by: null })
    } finally {
      child.kill('SIGKILL')
    }
  })

  it("leaves a live dispatcher's claims alone, and lets go of its presence lock when stopped", async () => {
    let finish = () => {}
    const handed: string[] = []
    const holding: Publisher = {
      publish: (message) => {
        handed.push(message.id)
        return new Promise<void>((resolve) => {
          finish = resolve
        })
      },
    }
    const holder = createDispatcher({
      pool: db.pool,
      publisher: holding,
      leaseMs: 60_000,
      pollIntervalMs: 100,
    })
    holder.start()
    try {
      await waitFor('the holder to take its presence lock', async () => (await presenceLocks()) === 1)
      const id = await enqueueOne(freshKey('alive'))
      await waitFor('the holder to publish', () => handed.includes(id))
      const other = createDispatcher({
        pool: db.pool,
        listen: false,
        publisher: { publish: async () => expect.fail('a live claim was taken over') },
      })
      expect(await other.dispatchOnce()).toBe(0)
      expect((await claimOf(id)).claimed_by).not.toBeNull()
      finish()
      await waitFor('the holder to mark it published', async () => (await claimOf(id)).status === 'published')
    } finally {
      finish()
      await holder.stop()
    }
    expect(await presenceLocks()).toBe(0)
  })
})
