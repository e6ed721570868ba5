// The Fetch adapter (@oncely/server/fetch, as built) in the runtimes its README names, each a real process serving
// fixtures/payments.ts over a real socket against the real Postgres: a Next.js App Router route handler under
// `next start` (one `next build` for the file), Bun.serve and Deno.serve from the npm packages `bun` and `deno`, and
// a Cloudflare Worker on workerd (the npm package `workerd`, the Worker bundled as wrangler would). Each runs the
// HTTP contract's core cases under both reservation protocols: replay, 422 for another payload, 409 while in flight,
// one execution under concurrent duplicates, and a crash mid-handler (the runtime's process killed with SIGKILL)
// that leaves no write and a retry that completes. Effects are counted for the cart (the key) under test.
//
// Each imports the package by its name through its `import` export, the built dist (turbo builds it before this
// test). The `@oncely/source` condition would work in Bun (`bun --conditions=@oncely/source`), and in Deno only with
// `--unstable-sloppy-imports` (the sources import `.js` names of `.ts` files); an application gets the dist.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { migrate } from '@oncely/server'
import { createTestDatabase, type TestDatabase } from '@oncely/test-support'
import { build } from 'esbuild'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'

const root = fileURLToPath(new URL('..', import.meta.url))
const require = createRequire(import.meta.url)
const nextApp = `${root}fixtures/next`
const nextBin = require.resolve('next/dist/bin/next')
// Each package's postinstall (allowed in pnpm-workspace.yaml) links the binary its platform package ships here.
const bunBin = `${root}node_modules/bun/bin/bun.exe`
const denoBin = `${root}node_modules/deno/deno`
const workerdBin = `${root}node_modules/workerd/bin/workerd`

/** The lease of the fixture's engine: under 'row', how long a crashed attempt's key stays taken. */
const LEASE_MS = 3_000
/** A bound on every wait of this file: a server coming up, a backend going away, a key freed after a crash. */
const WAIT_MS = 30_000

interface Command {
  file: string
  args: string[]
  cwd: string
}

interface Runtime {
  name: string
  /** Why the runtime cannot run on this machine, or undefined when it can. */
  missing(): string | undefined
  /** Done once before the first server starts (Next.js builds the app). */
  prepare?(): Promise<void>
  /** How to start its server on `port`, with the app's environment. */
  command(port: number, env: Record<string, string>): Command
}

/** Why `file` cannot run here (it is absent, or `--version` fails), or undefined. */
function cannotRun(file: string, versionArgs = ['--version']): string | undefined {
  const result = spawnSync(file, versionArgs, { encoding: 'utf8', timeout: 20_000 })
  if (result.error) return `${file} cannot run: ${result.error.message}`
  if (result.status !== 0) return `${file} --version exited ${result.status}: ${result.stderr.trim()}`
  return undefined
}

let built: Promise<void> | undefined
/** `next build` of the fixture app, once for the file, bounded in time. */
function buildNext(): Promise<void> {
  built ??= new Promise<void>((resolve, reject) => {
    const child = spawn(process.execPath, [nextBin, 'build'], {
      cwd: nextApp,
      env: { ...process.env, NEXT_TELEMETRY_DISABLED: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let output = ''
    child.stdout.on('data', (chunk) => {
      output += chunk
    })
    child.stderr.on('data', (chunk) => {
      output += chunk
    })
    const timer = setTimeout(() => child.kill('SIGKILL'), 240_000)
    child.once('exit', (code, signal) => {
      clearTimeout(timer)
      if (code === 0) resolve()
      else reject(new Error(`next build failed (${signal ?? `exit ${code}`}):\n${output}`))
    })
  })
  return built
}

/** Where the Worker's bundle and its workerd configurations are written, for this run. */
let workerDir: string | undefined
afterAll(() => {
  if (workerDir) rmSync(workerDir, { recursive: true, force: true })
})

/** Bundles the Worker as wrangler does: the Workers conditions (pg's socket on `cloudflare:sockets`), Node's
 * built-ins left to workerd, and require() of them (from pg, which is CommonJS) through node:module. */
let bundled: Promise<unknown> | undefined
async function bundleWorker(): Promise<void> {
  workerDir ??= mkdtempSync(join(tmpdir(), 'oncely-workerd-'))
  bundled ??= build({
    entryPoints: [`${root}fixtures/workerd.ts`],
    outfile: join(workerDir, 'worker.js'),
    bundle: true,
    format: 'esm',
    platform: 'node',
    conditions: ['workerd', 'worker'],
    external: ['cloudflare:sockets'],
    banner: { js: "import { createRequire } from 'node:module'; const require = createRequire('/');" },
    logLevel: 'error',
  })
  await bundled
}

let configs = 0
/**
 * A workerd configuration serving the Worker on `port`, with the app's environment as text bindings (workerd puts
 * them in process.env). Its outbound network allows loopback: workerd's default one refuses 127.0.0.1:5432.
 */
function workerdConfig(port: number, env: Record<string, string>): string {
  const bindings = Object.entries(env)
    .map(([name, value]) => `(name = ${JSON.stringify(name)}, text = ${JSON.stringify(value)})`)
    .join(', ')
  const file = join(workerDir!, `config-${++configs}.capnp`)
  writeFileSync(
    file,
    `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    (name = "loopback", network = (allow = ["local"])),
  ],
  sockets = [(name = "http", address = "127.0.0.1:${port}", http = (), service = "main")],
);
const worker :Workerd.Worker = (
  modules = [(name = "worker", esModule = embed "worker.js")],
  compatibilityDate = "2026-11-01",
  globalOutbound = "loopback",
  bindings = [${bindings}],
);
`,
  )
  return file
}

const runtimes: Runtime[] = [
  {
    name: 'Next.js route handler (next start)',
    missing: () => cannotRun(process.execPath, [nextBin, '--version']),
    prepare: buildNext,
    // The CLI serves in its own process (it names itself next-server), so the kill below reaches the server.
    command: (port) => ({
      file: process.execPath,
      args: [nextBin, 'start', '-H', '127.0.0.1', '-p', String(port)],
      cwd: nextApp,
    }),
  },
  {
    name: 'Bun.serve',
    missing: () => cannotRun(bunBin),
    command: () => ({ file: bunBin, args: ['fixtures/bun.ts'], cwd: root }),
  },
  {
    name: 'Deno.serve',
    missing: () => cannotRun(denoBin),
    command: () => ({ file: denoBin, args: ['run', '--allow-all', 'fixtures/deno.ts'], cwd: root }),
  },
  {
    name: 'Cloudflare Worker (workerd)',
    missing: () => cannotRun(workerdBin),
    prepare: bundleWorker,
    command: (port, env) => ({
      file: workerdBin,
      args: ['serve', workerdConfig(port, env)],
      cwd: workerDir!,
    }),
  },
]

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

async function waitFor(what: string, condition: () => Promise<boolean>): Promise<void> {
  const until = Date.now() + WAIT_MS
  while (!(await condition())) {
    if (Date.now() > until) throw new Error(`${what}: not within ${WAIT_MS} ms`)
    await sleep(50)
  }
}

async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return port
}

interface Server {
  url: string
  /** The application_name of the server's Postgres sessions, so the test can see them go. */
  session: string
  output(): string
  /** SIGKILL: the process stops wherever it is, with no handler, no finally and no socket closed by it. */
  kill(): Promise<void>
}

let started = 0
async function startServer(runtime: Runtime, db: TestDatabase, reservation: 'row' | 'lock'): Promise<Server> {
  const port = await freePort()
  const session = `oncely-runtime-${process.pid}-${++started}`
  const url = new URL(db.url)
  url.searchParams.set('application_name', session)
  const app = {
    PORT: String(port),
    DATABASE_URL: url.toString(),
    ONCELY_RESERVATION: reservation,
    ONCELY_LEASE_MS: String(LEASE_MS),
    ONCELY_RUNTIME: runtime.name,
  }
  const { file, args, cwd } = runtime.command(port, app)
  const child: ChildProcess = spawn(file, args, {
    cwd,
    env: { ...process.env, ...app, NEXT_TELEMETRY_DISABLED: '1', DENO_NO_UPDATE_CHECK: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  child.stdout?.on('data', (chunk) => {
    output += chunk
  })
  child.stderr?.on('data', (chunk) => {
    output += chunk
  })
  // 'error' without 'exit' when the binary could not be started at all.
  const exited = new Promise<void>((resolve) => {
    child.once('exit', () => resolve())
    child.once('error', (error) => {
      output += `\n${error.message}`
      resolve()
    })
  })
  const kill = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    await exited
  }
  const base = `http://127.0.0.1:${port}`
  try {
    // Up once it answers anything (the fixture's /health; a 404 page on Next.js).
    await waitFor(`${runtime.name} listening`, async () => {
      if (child.exitCode !== null || child.pid === undefined) {
        throw new Error(`${runtime.name} did not start (exit ${child.exitCode}):\n${output}`)
      }
      return fetch(`${base}/health`).then(
        () => true,
        () => false,
      )
    })
  } catch (error) {
    await kill()
    throw error
  }
  return { url: base, session, output: () => output, kill }
}

interface Result {
  status: number
  headers: Headers
  text: string
  // biome-ignore lint/suspicious/noExplicitAny: tests read the JSON they sent back
  json(): any
}

async function post(server: Server, key: string, body: unknown): Promise<Result> {
  const response = await fetch(`${server.url}/v1/payments`, {
    method: 'POST',
    headers: {
      authorization: 'Bearer tenant_1',
      'content-type': 'application/json',
      'idempotency-key': key,
    },
    body: JSON.stringify(body),
  })
  const text = await response.text()
  return { status: response.status, headers: response.headers, text, json: () => JSON.parse(text) }
}

let keys = 0
const freshKey = () => `rt-${process.pid}-${++keys}-${Math.random().toString(36).slice(2)}`

const ci = Boolean(process.env.CI)

describe.each(runtimes)('$name', (runtime) => {
  // Left out only where the binary cannot run on this machine, never under CI.
  const missing = ci ? undefined : runtime.missing()
  if (missing) console.warn(`@oncely/runtimes: ${runtime.name} is left out: ${missing}`)

  describe.skipIf(missing !== undefined).each(['row', 'lock'] as const)('reservation %s', (reservation) => {
    let db: TestDatabase
    let server: Server
    /** Holds the advisory lock that a request with `hold: true` waits for, inside its transaction. */
    let holder: pg.Client

    beforeAll(async () => {
      await runtime.prepare?.()
      db = await createTestDatabase(`runtimes_${reservation}`)
      await migrate(db.pool)
      await db.pool.query(`CREATE TABLE payments (
        id bigserial PRIMARY KEY, tenant text NOT NULL, cart text NOT NULL, amount integer NOT NULL)`)
      holder = new pg.Client({ connectionString: db.url })
      await holder.connect()
      server = await startServer(runtime, db, reservation)
    })
    afterAll(async () => {
      await server?.kill()
      await holder?.end().catch(() => {})
      await db?.drop()
    })

    const effects = async (cart: string) =>
      (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE cart = $1', [cart])).rows[0]
        .n as number
    const hold = (cart: string) => holder.query('SELECT pg_advisory_lock(4242, hashtext($1))', [cart])
    const release = (cart: string) => holder.query('SELECT pg_advisory_unlock(4242, hashtext($1))', [cart])
    /** Resolves once a request with `hold: true` waits for the lock: its insert is made and not committed. */
    const held = () =>
      waitFor('the request waiting in its handler', async () => {
        const { rows } = await db.pool.query(
          `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_database d ON d.oid = l.database
           WHERE d.datname = $1 AND l.locktype = 'advisory' AND l.classid = 4242 AND l.objsubid = 2
             AND NOT l.granted`,
          [db.name],
        )
        return rows[0].n > 0
      })

    it('replays the same status and bytes with Idempotent-Replayed, without running again', async () => {
      const key = freshKey()
      const first = await post(server, key, { cart: key, amount: 100 })
      const second = await post(server, key, { cart: key, amount: 100 })
      expect(first.status, server.output()).toBe(201)
      expect(first.json()).toMatchObject({ cart: key, amount: 100, runtime: runtime.name })
      expect(first.headers.get('idempotent-replayed')).toBeNull()
      expect(second.status).toBe(201)
      expect(second.text).toBe(first.text)
      expect(second.headers.get('location')).toBe(first.headers.get('location'))
      expect(second.headers.get('idempotent-replayed')).toBe('true')
      expect(await effects(key)).toBe(1)
    })

    it('answers 422 idempotency_key_reused for the same key with another payload, and runs nothing', async () => {
      const key = freshKey()
      expect((await post(server, key, { cart: key, amount: 1 })).status).toBe(201)
      const other = await post(server, key, { cart: key, amount: 2 })
      expect(other.status).toBe(422)
      expect(other.headers.get('content-type')).toBe('application/problem+json')
      expect(other.json()).toMatchObject({ code: 'idempotency_key_reused' })
      expect(await effects(key)).toBe(1)
    })

    it('answers 409 request_in_progress + Retry-After while the first is in flight, then replays it', async () => {
      const key = freshKey()
      const body = { cart: key, amount: 1, hold: true }
      await hold(key)
      const first = post(server, key, body)
      try {
        await held()
        const duplicate = await post(server, key, body)
        expect(duplicate.status).toBe(409)
        expect(duplicate.headers.get('content-type')).toBe('application/problem+json')
        expect(duplicate.json()).toMatchObject({ code: 'request_in_progress' })
        expect(Number(duplicate.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      } finally {
        await release(key)
      }
      const done = await first
      expect(done.status).toBe(201)
      const replay = await post(server, key, body)
      expect(replay.headers.get('idempotent-replayed')).toBe('true')
      expect(replay.text).toBe(done.text)
      expect(await effects(key)).toBe(1)
    })

    it('runs concurrent duplicates once: every answer is 409 or the identical response', async () => {
      const key = freshKey()
      const body = { cart: key, amount: 42 }
      const results = await Promise.all(Array.from({ length: 20 }, () => post(server, key, body)))
      expect(await effects(key)).toBe(1)
      const created = results.filter((r) => r.status === 201)
      const conflicts = results.filter((r) => r.status === 409)
      expect(created.length + conflicts.length).toBe(20)
      expect(created.filter((r) => r.headers.get('idempotent-replayed') === null)).toHaveLength(1)
      for (const replay of created) expect(replay.text).toBe(created[0]!.text)
      for (const conflict of conflicts) {
        expect(conflict.json()).toMatchObject({ code: 'request_in_progress' })
        expect(Number(conflict.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
      }
    })

    it('a process killed (SIGKILL) mid-handler leaves no write, and the retry on a new process completes once', async () => {
      const key = freshKey()
      // The retry is the same request: with the lock released, its handler goes through at once.
      const body = { cart: key, amount: 5, hold: true }
      await hold(key)
      // Mid-handler: the payment is inserted in the idempotency transaction, not committed.
      const first = post(server, key, body).then(
        (res) => res.status,
        () => 'no answer',
      )
      try {
        await held()
        await server.kill()
        expect(await first).toBe('no answer')
      } finally {
        // The dead process's backend, granted the lock, finds its client gone and rolls back.
        await release(key)
      }
      const dead = server.session
      await waitFor('the killed process’s Postgres sessions ending', async () => {
        const { rows } = await db.pool.query(
          'SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name = $2',
          [db.name, dead],
        )
        return rows[0].n === 0
      })
      expect(await effects(key)).toBe(0)

      server = await startServer(runtime, db, reservation)
      // Under 'lock' the key is free once the dead transaction ended; under 'row' its row is taken (409) until the
      // dead attempt's lease ran out, and the next attempt takes over.
      let retry = await post(server, key, body)
      const waited: number[] = []
      const until = Date.now() + WAIT_MS
      while (retry.status === 409 && Date.now() < until) {
        waited.push(retry.status)
        await sleep(200)
        retry = await post(server, key, body)
      }
      expect(retry.status, server.output()).toBe(201)
      expect(retry.headers.get('idempotent-replayed')).toBeNull()
      if (reservation === 'lock') expect(waited).toEqual([])
      const again = await post(server, key, body)
      expect(again.headers.get('idempotent-replayed')).toBe('true')
      expect(again.text).toBe(retry.text)
      expect(await effects(key)).toBe(1)
    })
  })
})
