// A real Citus cluster for tests: a coordinator and workers on loopback ports (scripts/citus-cluster.mjs), and a fresh
// database on it per test file. Citus is built into Debian's PostgreSQL 15 (.ci/run). Missing outside CI: the tests
// are skipped with a one-line reason. Missing under CI: an error, so CI can never pass without running them.
import { type ChildProcessWithoutNullStreams, execFileSync, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { chmodSync, existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { type TestDatabase, withDatabase } from './index.js'

const SCRIPT = fileURLToPath(new URL('../../../scripts/citus-cluster.mjs', import.meta.url))

/** The PostgreSQL binaries Citus is installed into: Debian's PostgreSQL 15, or CITUS_PG_BINDIR. */
export function citusBindir(): string {
  return process.env.CITUS_PG_BINDIR || '/usr/lib/postgresql/15/bin'
}

/** Why Citus cannot run on this machine, or undefined when it can. */
export function citusMissing(): string | undefined {
  const bindir = citusBindir()
  if (!existsSync(path.join(bindir, 'postgres')))
    return `no PostgreSQL server at ${bindir} (set CITUS_PG_BINDIR)`
  let libdir = path.join(bindir, '..', 'lib')
  try {
    libdir = execFileSync(path.join(bindir, 'pg_config'), ['--pkglibdir'], { encoding: 'utf8' }).trim()
  } catch {
    // no pg_config: Debian's layout
  }
  if (!existsSync(path.join(libdir, 'citus.so'))) return `Citus is not installed into ${libdir} (no citus.so)`
  return undefined
}

/**
 * True when Citus is installed. Throws under `CI` when it is not (CI builds it: see .ci/run); elsewhere prints one
 * line saying what `suite` skips and why.
 *
 * @example
 * const hasCitus = requireCitus('reaper on Citus')
 * describe.skipIf(!hasCitus)('the reaper on a distributed key table', () => { ... })
 */
export function requireCitus(suite: string): boolean {
  const missing = citusMissing()
  if (!missing) return true
  if (process.env.CI) throw new Error(`${suite}: ${missing}; CI must run it (.ci/run builds Citus)`)
  console.warn(`${suite} skipped: ${missing}`)
  return false
}

/** One node of a running cluster. */
export interface CitusNode {
  /** `coordinator`, `worker1`, `worker2`... */
  name: string
  /** Its port on 127.0.0.1. */
  port: number
  /** The pid of its postmaster (changes when the node is restarted). */
  pid: number
  /** A connection string for its `postgres` database. */
  url: string
}

/** A running cluster, from {@link startCitusCluster}. */
export interface CitusCluster {
  /** The coordinator's `postgres` database, where the workers are registered. */
  url: string
  /** Every node, coordinator first. */
  nodes: CitusNode[]
  /**
   * Restarts one node: `fast` is a clean shutdown (SIGINT), `crash` an immediate one (SIGQUIT, no checkpoint). Resolves
   * once it accepts connections again.
   */
  restart(node: string, how?: 'fast' | 'crash'): Promise<void>
  /** Stops one node (a clean shutdown), leaving it down until {@link CitusCluster.startNode}. */
  stopNode(node: string): Promise<void>
  /** Starts a node stopped by {@link CitusCluster.stopNode}; resolves once it accepts connections. */
  startNode(node: string): Promise<void>
  /** Stops every node and removes their data. */
  stop(): Promise<void>
}

/**
 * Starts a coordinator and `workers` workers (Debian's PostgreSQL 15 with Citus), each on a free loopback port, and
 * registers the workers. Throws when Citus is missing.
 *
 * @example
 * const cluster = await startCitusCluster()
 * const db = await createCitusTestDatabase('reaper', { cluster: cluster.url })
 */
export async function startCitusCluster(
  options: {
    /** @default 2 */
    workers?: number
    /** More server settings for every node, e.g. `['fsync=on']` (a throwaway cluster runs with fsync off). */
    settings?: readonly string[]
  } = {},
): Promise<CitusCluster> {
  const missing = citusMissing()
  if (missing) throw new Error(`Cannot start a Citus cluster: ${missing}. .ci/run builds Citus.`)
  const base = mkdtempSync(path.join(tmpdir(), 'oncely-citus-'))
  // As root the nodes run as the `postgres` OS user, which must be able to enter the directory.
  if (process.getuid?.() === 0) chmodSync(base, 0o777)
  const child: ChildProcessWithoutNullStreams = spawn(
    process.execPath,
    [
      SCRIPT,
      '--dir',
      path.join(base, 'cluster'),
      '--workers',
      String(options.workers ?? 2),
      ...(options.settings ?? []).flatMap((setting) => ['--set', setting]),
    ],
    { stdio: 'pipe' },
  )
  let stderr = ''
  child.stderr.on('data', (chunk) => {
    stderr += chunk
  })
  const lines = createInterface({ input: child.stdout })
  const nodes: CitusNode[] = []
  const waiting = new Map<string, (line: string) => void>()
  const ready = new Promise<string>((resolve, reject) => {
    lines.on('line', (line) => {
      const [word, ...rest] = line.split(' ')
      if (word === 'NODE') {
        const [name, pid, url] = rest as [string, string, string]
        nodes.push({ name, pid: Number(pid), url, port: Number(new URL(url).port) })
      } else if (word === 'READY') resolve(rest.join(' '))
      else if (word === 'DONE' || word === 'FAILED') {
        for (const [command, answer] of waiting)
          if (line.startsWith(`${word} ${command}`)) {
            waiting.delete(command)
            answer(line)
          }
      }
    })
    child.once('exit', (code) => reject(new Error(`the Citus cluster exited (${code}): ${stderr.trim()}`)))
  })
  let url: string
  try {
    url = await ready
  } catch (error) {
    rmSync(base, { recursive: true, force: true })
    throw error
  }
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  /** Sends one command to the cluster script and waits for its answer; a node it (re)started gets its new pid. */
  const control = async (command: string, name: string) => {
    const answer = await new Promise<string>((resolve) => {
      waiting.set(command, resolve)
      child.stdin.write(`${command}\n`)
    })
    if (answer.startsWith('FAILED')) throw new Error(`citus-cluster: ${answer}`)
    const node = nodes.find((n) => n.name === name)
    const pid = Number(answer.split(' ').at(-1))
    if (node && pid) node.pid = pid
  }
  return {
    url,
    nodes,
    restart: (name, how = 'fast') => control(`${how === 'crash' ? 'crash' : 'restart'} ${name}`, name),
    stopNode: (name) => control(`stop ${name}`, name),
    startNode: (name) => control(`start ${name}`, name),
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM')
        await exited
      }
      rmSync(base, { recursive: true, force: true })
    },
  }
}

/** A fresh database on a Citus cluster: {@link TestDatabase} on the coordinator, and where its nodes are. */
export interface CitusTestDatabase extends TestDatabase {
  /** The database's connection string on each node, coordinator first (the same name on every node). */
  nodeUrls: { name: string; url: string }[]
}

/**
 * Drops a database, waiting while something Citus started still uses it (55006): its maintenance daemon, or a
 * connection between nodes the test just closed, which FORCE cannot always end at once.
 */
async function dropDatabase(client: pg.Client, name: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await client.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
      return
    } catch (error) {
      if ((error as { code?: string }).code !== '55006' || attempt >= 50) throw error
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
}

async function onNode<T>(url: string, run: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  client.on('error', () => {})
  await client.connect()
  try {
    return await run(client)
  } finally {
    await client.end()
  }
}

/**
 * Creates a fresh database on every node of the cluster whose coordinator `cluster` names (default: CITUS_URL),
 * creates the extension in each, and registers the workers in it (Citus keeps its node list per database), so files
 * can run in parallel without sharing tables. The pool is on the coordinator.
 *
 * @example
 * let db: CitusTestDatabase
 * beforeAll(async () => { db = await createCitusTestDatabase('outbox', { cluster: inject('citusUrl') }) })
 * afterAll(() => db.drop())
 */
export async function createCitusTestDatabase(
  label = 'test',
  options: {
    cluster?: string
    pool?: pg.PoolConfig
    /** Register only the first this many workers in the database (the others can be added later). @default all */
    workers?: number
  } = {},
): Promise<CitusTestDatabase> {
  const cluster = options.cluster ?? process.env.CITUS_URL
  if (!cluster) throw new Error('No Citus cluster: pass `cluster` (a coordinator URL) or set CITUS_URL.')
  const name = `oncely_${label.replace(/[^a-z0-9_]/gi, '_').toLowerCase()}_${randomBytes(4).toString('hex')}`
  const coordinator = new URL(cluster)
  const workers = await onNode(cluster, async (client) => {
    const { rows } = await client.query<{ nodename: string; nodeport: number }>(
      `SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeid`,
    )
    return options.workers === undefined ? rows : rows.slice(0, options.workers)
  })
  const nodeUrl = (host: string, port: number | string) => {
    const url = new URL(cluster)
    url.hostname = host
    url.port = String(port)
    return url.toString()
  }
  const nodes = [
    { name: 'coordinator', url: cluster },
    ...workers.map((w, i) => ({ name: `worker${i + 1}`, url: nodeUrl(w.nodename, w.nodeport) })),
  ]
  await Promise.all(
    nodes.map(async (node) => {
      await onNode(node.url, (client) => client.query(`CREATE DATABASE "${name}" TEMPLATE template0`))
      await onNode(withDatabase(node.url, name), (client) => client.query('CREATE EXTENSION citus'))
    }),
  )
  const url = withDatabase(cluster, name)
  await onNode(url, async (client) => {
    await client.query('SELECT citus_set_coordinator_host($1, $2)', [
      coordinator.hostname,
      Number(coordinator.port || 5432),
    ])
    for (const w of workers) await client.query('SELECT citus_add_node($1, $2)', [w.nodename, w.nodeport])
  })
  const pool = new pg.Pool({ connectionString: url, max: 10, ...options.pool })
  pool.on('error', () => {})
  let dropped = false
  return {
    url,
    name,
    pool,
    nodeUrls: nodes.map((node) => ({ name: node.name, url: withDatabase(node.url, name) })),
    async drop() {
      if (dropped) return
      dropped = true
      await pool.end().catch(() => {})
      await Promise.all(nodes.map((node) => onNode(node.url, (client) => dropDatabase(client, name))))
    },
  }
}
