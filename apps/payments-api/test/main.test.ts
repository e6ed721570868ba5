/**
 * The real entry point as a child process: configuration errors, and a SIGKILL from a chaos crash point between
 * the charge step and the commit, after which a retry with the same key takes over the lease, resumes from the
 * recovery point and charges once.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { prepareDatabase } from '../src/database.js'
import { count, recoveryPoint } from './support/app.js'

const MAIN = path.resolve(import.meta.dirname, '../src/main.ts')

interface Started {
  child: ChildProcess
  url: string
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
}

function start(env: Record<string, string>): Promise<Started> {
  const child = spawn(process.execPath, ['--conditions=@oncely/source', '--import', 'tsx', MAIN], {
    cwd: path.resolve(import.meta.dirname, '..'),
    env: { ...process.env, PORT: '0', LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  )
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const match = /ready at (http:\/\/\S+?)\/? /.exec(line)
      if (match) resolve({ child, url: match[1]!, exited })
    })
    let stderr = ''
    child.stderr!.on('data', (chunk) => {
      stderr += chunk
    })
    void exited.then(({ code }) =>
      reject(new Error(`payments-api exited with ${code} before it was ready: ${stderr}`)),
    )
  })
}

function pay(url: string, key: string) {
  return fetch(`${url}/v1/payments`, {
    method: 'POST',
    headers: { authorization: 'Bearer crash', 'idempotency-key': key, 'content-type': 'application/json' },
    body: JSON.stringify({ amount: 500, currency: 'eur' }),
  })
}

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('payments_main')
  await prepareDatabase(db.pool)
})
afterAll(() => db?.drop())

describe('main', () => {
  it('refuses a bad configuration with a message naming the variable, exit code 1', async () => {
    const child = spawn(process.execPath, ['--conditions=@oncely/source', '--import', 'tsx', MAIN], {
      env: { ...process.env, DATABASE_URL: db.url, ONCELY_LEASE_MS: 'soon' },
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    let stderr = ''
    child.stderr.on('data', (chunk) => {
      stderr += chunk
    })
    const code = await new Promise((resolve) => child.once('exit', resolve))
    expect(code).toBe(1)
    expect(stderr).toContain('ONCELY_LEASE_MS must be an integer')
  })

  it('dies by SIGKILL at a crash point; after the lease a retry with the same key charges once', async () => {
    const key = randomUUID()
    const crashing = await start({
      DATABASE_URL: db.url,
      ONCELY_CHAOS: '1',
      ONCELY_CRASH_AT: 'after-provider',
      ONCELY_LEASE_MS: '500',
    })
    await expect(pay(crashing.url, key)).rejects.toThrow()
    expect(await crashing.exited).toEqual({ code: null, signal: 'SIGKILL' })
    // The provider took the charge and the charge step committed it as the key's recovery point; the business
    // transaction died with the process.
    expect(await count(db.pool, 'provider_charges', ['tenant_id', 'crash'])).toBe(1)
    expect(await count(db.pool, 'payments', ['tenant_id', 'crash'])).toBe(0)
    const point = await recoveryPoint(db.pool, 'crash', key)
    expect(point).toMatchObject({ step: 'charge', state: { chargeId: expect.stringMatching(/^ch_/) } })

    const healthy = await start({ DATABASE_URL: db.url, ONCELY_LEASE_MS: '500' })
    try {
      let res = await pay(healthy.url, key)
      for (let i = 0; res.status === 409 && i < 20; i++) {
        await new Promise((resolve) => setTimeout(resolve, 250))
        res = await pay(healthy.url, key)
      }
      expect(res.status).toBe(201)
      // Resumed from the recovery point: the payment carries the charge taken before the crash.
      expect((await res.json()).chargeId).toBe(point?.state.chargeId)
      expect(await count(db.pool, 'provider_charges', ['tenant_id', 'crash'])).toBe(1)
      expect(await count(db.pool, 'payments', ['tenant_id', 'crash'])).toBe(1)
    } finally {
      healthy.child.kill('SIGTERM')
      expect(await healthy.exited).toEqual({ code: 0, signal: null })
    }
  })

  // Regression (found by the chaos suite): with the chaos-only "idempotency off" path, a checked-out client whose
  // connection was terminated emitted 'error' with no listener and the process crashed.
  it('survives its database connections being terminated mid-request', async () => {
    const api = await start({
      DATABASE_URL: db.url,
      ONCELY_CHAOS: '1',
      ONCELY_UNSAFE_DISABLE_IDEMPOTENCY: '1',
      ONCELY_PROVIDER_DELAY_MS: '300',
    })
    try {
      const inFlight = Promise.all([1, 2, 3].map(() => pay(api.url, randomUUID()).catch(() => undefined)))
      await new Promise((resolve) => setTimeout(resolve, 150))
      await db.pool.query(
        'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
        [db.name],
      )
      await inFlight
      let res = await pay(api.url, randomUUID()).catch(() => undefined)
      for (let i = 0; res?.status !== 201 && i < 20; i++) {
        await new Promise((resolve) => setTimeout(resolve, 100))
        res = await pay(api.url, randomUUID()).catch(() => undefined)
      }
      expect(res?.status).toBe(201)
      expect(api.child.exitCode).toBeNull()
    } finally {
      api.child.kill('SIGTERM')
      await api.exited
    }
  })
})
