// The replay cache against a real streaming standby: it answers from memory only while no commit the primary
// acknowledged can be missing on a standby. Regression: under asynchronous replication a failover loses the last
// commits, and the cache replayed their payments (the chaos suite's asynchronous failover through PgBouncer found
// 95 such replays in one run), because traffic kept confirming the old primary until the moment it was gone and a
// pooler kept the connections open. A throwaway primary and standby of our own (scripts/pg-server.mjs), never the
// machine's Postgres.
import { type ChildProcess, spawn } from 'node:child_process'
import { chmod, mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import pg from 'pg'
import { afterAll, beforeAll, expect, it, vi } from 'vitest'
import { createEngine, type Engine, migrate, postgresStore } from '../src/index.js'
import { fingerprintOf, freshKey, sleep } from './helpers.js'

const script = path.resolve(import.meta.dirname, '../../../scripts/pg-server.mjs')
let dir: string
const servers: ChildProcess[] = []
let primary: pg.Pool
let checkouts = 0

/** Starts pg-server.mjs; resolves with its connection URL and port once it prints READY. */
function startPostgres(args: string[]): Promise<{ url: string; port: number }> {
  const child = spawn(process.execPath, [script, ...args], { stdio: ['pipe', 'pipe', 'inherit'] })
  servers.push(child)
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (line) => {
      const ready = /^READY (postgres:\/\/\S+@127\.0\.0\.1:(\d+)\/\S*)/.exec(line)
      if (ready) resolve({ url: ready[1]!, port: Number(ready[2]) })
    })
    child.once('exit', (code) => reject(new Error(`pg-server exited with ${code}`)))
  })
}

/** Polls `condition` until it holds, failing after `boundMs` (a liveness bound, not a timing assertion). */
async function until(what: string, condition: () => Promise<boolean> | boolean, boundMs = 30_000) {
  const deadline = Date.now() + boundMs
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`${what} did not happen within ${boundMs} ms`)
    await sleep(50)
  }
}

const streamingState = async () =>
  (
    await primary.query<{ sync_state: string }>(
      "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby_1' AND state = 'streaming'",
    )
  ).rows[0]?.sync_state

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'oncely-standby-'))
  // As root, the servers run as the `postgres` OS user, which must reach their directories inside this one.
  await chmod(dir, 0o755)
  const primaryDir = path.join(dir, 'primary')
  const { url, port } = await startPostgres(['--dir', primaryDir, '--persistent'])
  await startPostgres([
    '--dir',
    path.join(dir, 'standby'),
    '--persistent',
    '--standby-of',
    primaryDir,
    '--primary-port',
    String(port),
    '--slot',
    'standby_1',
  ])
  primary = new pg.Pool({ connectionString: url, max: 4 })
  primary.on('error', () => {})
  primary.on('acquire', () => checkouts++)
  await migrate(primary)
  await until('the standby to stream', async () => (await streamingState()) !== undefined)
}, 180_000)

afterAll(async () => {
  await primary?.end().catch(() => {})
  await Promise.all(
    servers.map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null) return resolve()
          child.once('exit', () => resolve())
          child.kill('SIGTERM')
        }),
    ),
  )
  if (dir) await rm(dir, { recursive: true, force: true })
}, 60_000)

const engineOnPrimary = () => createEngine({ store: postgresStore({ pool: primary }) })
const input = (key: string) => ({
  scope: 'standby',
  operation: 'POST /v1/payments',
  key,
  fingerprint: fingerprintOf({ amount: 1 }),
  handler: async () => ({ status: 201, body: { paid: key } }),
})
/** How many connections a replay of `key` took: 0 when the cache answered it. */
async function replayCheckouts(engine: Engine, key: string): Promise<number> {
  const before = checkouts
  const outcome = await engine.execute(input(key))
  expect(outcome.kind).toBe('replayed')
  return checkouts - before
}

it('does not answer while the primary streams to an asynchronous standby, and says so once', async () => {
  expect(await streamingState()).toBe('async')
  const warn = vi.spyOn(console, 'warn').mockImplementation(() => {})
  try {
    const engine = engineOnPrimary()
    const key = freshKey()
    expect((await engine.execute(input(key))).kind).toBe('executed')
    await until('the warning', () => warn.mock.calls.length > 0)
    expect(String(warn.mock.calls[0]?.[0])).toMatch(/asynchronous|synchronous_standby_names/)
    // Every replay asks the database, however often it is asked (a replication check due meanwhile takes a
    // connection of the same pool too, so at least one).
    for (let i = 0; i < 3; i++) expect(await replayCheckouts(engine, key)).toBeGreaterThanOrEqual(1)
    expect(warn).toHaveBeenCalledTimes(1)
  } finally {
    warn.mockRestore()
  }
}, 60_000)

it('answers again once the standby is synchronous: no acknowledged commit can be lost in a failover to it', async () => {
  await primary.query(`ALTER SYSTEM SET synchronous_standby_names = '"standby_1"'`)
  await primary.query('SELECT pg_reload_conf()')
  await until('the standby to be synchronous', async () => (await streamingState()) === 'sync')
  const engine = engineOnPrimary()
  const key = freshKey()
  expect((await engine.execute(input(key))).kind).toBe('executed')
  // The check runs off the request's path: the cache answers as soon as it did.
  await until('a replay from the cache', async () => (await replayCheckouts(engine, key)) === 0)
}, 60_000)
