// Acceptance: Postgres restarted during a load of concurrent requests. A throwaway embedded Postgres of our own (never
// the machine's) is stopped and started again on the same data directory and port while clients keep retrying.
import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { migrate } from '../src/index.js'
import { buildApp } from './app.js'
import { freshKey, sleep } from './helpers.js'
import { type HttpResult, postPayment } from './http.js'

const script = path.resolve(import.meta.dirname, '../../../scripts/pg-server.mjs')
let dir: string
let server: ChildProcess | undefined
let pool: pg.Pool
let app: FastifyInstance
let url: string

function startPostgres(port?: number): Promise<{ child: ChildProcess; connection: string }> {
  const args = [script, '--dir', dir, '--persistent', ...(port ? ['--port', String(port)] : [])]
  const child = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'] })
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream })
    lines.on('line', (line) => {
      if (line.startsWith('READY ')) resolve({ child, connection: line.slice('READY '.length) })
    })
    child.once('exit', (code) => reject(new Error(`pg-server exited with ${code}`)))
  })
}

function stopPostgres(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    child.once('exit', () => resolve())
    child.kill('SIGTERM')
  })
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'oncely-restart-'))
  const started = await startPostgres()
  server = started.child
  pool = new pg.Pool({ connectionString: started.connection, max: 10, connectionTimeoutMillis: 2_000 })
  pool.on('error', () => {})
  await migrate(pool)
  await pool.query('CREATE TABLE payments (id bigserial PRIMARY KEY, tenant text, cart text, amount integer)')
  ;({ app } = await buildApp(pool, { leaseMs: 1_000 }))
  url = await app.listen({ port: 0, host: '127.0.0.1' })
}, 120_000)

afterAll(async () => {
  await app?.close()
  await pool?.end().catch(() => {})
  if (server) await stopPostgres(server)
  await rm(dir, { recursive: true, force: true })
}, 60_000)

it('keeps the process up through a restart, then serves: one effect per key, identical answers', async () => {
  const port = Number(new URL((pool.options as { connectionString: string }).connectionString).port)
  const keys = Array.from({ length: 15 }, () => freshKey('restart'))
  const seen: HttpResult[][] = keys.map(() => [])
  const until = Date.now() + 60_000
  const load = keys.flatMap((key, i) =>
    Array.from({ length: 2 }, async () => {
      while (Date.now() < until) {
        const result = await postPayment(url, key, { cart: key, amount: 1 })
        seen[i]?.push(result)
        if (result.status === 201) return
        await sleep(100)
      }
    }),
  )
  await sleep(150)
  await stopPostgres(server as ChildProcess)
  await sleep(500) // requests during the outage get 503 store_unavailable, not a crash
  server = (await startPostgres(port)).child
  await Promise.all(load)

  const outage = seen.flat().filter((r) => r.status === 503)
  expect(outage.length).toBeGreaterThan(0)
  const { rows } = await pool.query<{ cart: string; n: number }>(
    'SELECT cart, count(*)::int AS n FROM payments GROUP BY cart',
  )
  expect(rows).toHaveLength(keys.length)
  for (const row of rows) expect(row.n, `effects for ${row.cart}`).toBe(1)
  keys.forEach((_, i) => {
    const created = (seen[i] ?? []).filter((r) => r.status === 201)
    expect(created.length).toBeGreaterThan(0)
    for (const r of created) expect(r.body.equals(created[0]?.body as Buffer)).toBe(true)
  })
}, 120_000)
