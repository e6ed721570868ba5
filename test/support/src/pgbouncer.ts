// A real PgBouncer in transaction mode in front of the test Postgres, on a loopback port of its own: what most
// production Postgres is reached through. Debian's `pgbouncer` package (`.ci/run` installs it), or PGBOUNCER_PATH.
import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { accessSync, chownSync, constants, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { adminUrl, withDatabase } from './index.js'
import { accepts, freePort, waitFor } from './services.js'

/** A running PgBouncer. */
export interface PgBouncer {
  /** Its port on 127.0.0.1. */
  port: number
  /** A connection string for `database` through the pooler. */
  url(database: string): string
  /**
   * Stops it and starts it again on the same port with the same settings: `'clean'` lets it finish the transactions
   * in progress first (SIGINT, its safe shutdown), `'crash'` kills it (SIGKILL), dropping every client and server
   * connection at once. Resolves once it accepts connections again.
   */
  restart(how: 'clean' | 'crash'): Promise<void>
  /** Stops it (SIGTERM) and removes its files. */
  stop(): Promise<void>
}

/** Where the pgbouncer binary is, or undefined when it is not installed. */
export function pgbouncerPath(): string | undefined {
  for (const candidate of [process.env.PGBOUNCER_PATH, '/usr/sbin/pgbouncer', '/usr/bin/pgbouncer']) {
    if (!candidate) continue
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch {
      // not here
    }
  }
  return undefined
}

/** Options of {@link startPgBouncer}. */
export interface PgBouncerOptions {
  /** Server connections per database. @default 4 */
  poolSize?: number
  /** The Postgres server to pool (its user and password are used; its database name is not). @default DATABASE_URL */
  target?: string
  /**
   * More `[pgbouncer]` settings, e.g. `{ server_login_retry: 1 }`.
   * @default {}
   */
  settings?: Record<string, string | number>
  /** Picks the port to try next (a test can hand it one that is taken). @default a port free right now */
  pickPort?: () => Promise<number>
}

/**
 * Starts PgBouncer in transaction mode in front of a Postgres server (the one DATABASE_URL names unless `target`
 * says otherwise): every database on it, through one pool per database of `poolSize` server connections, so
 * consecutive transactions of one client land on different server connections (which is what breaks session state
 * and prepared statements). Throws when pgbouncer is missing.
 *
 * @example
 * const bouncer = await startPgBouncer()
 * const pool = new pg.Pool({ connectionString: bouncer.url(db.name) })
 */
export async function startPgBouncer(options: PgBouncerOptions = {}): Promise<PgBouncer> {
  const binary = pgbouncerPath()
  if (!binary)
    throw new Error('pgbouncer is not installed (Debian: apt-get install pgbouncer, or set PGBOUNCER_PATH).')
  const target = new URL(options.target ?? adminUrl())
  const user = decodeURIComponent(target.username || 'postgres')
  const password = decodeURIComponent(target.password)
  const dir = mkdtempSync(path.join(tmpdir(), 'oncely-pgbouncer-'))
  const server = [`host=${target.hostname}`, `port=${target.port || 5432}`, `user=${user}`]
  if (password) server.push(`password=${password}`)
  const config = (port: number) => `[databases]
* = ${server.join(' ')}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = ${options.poolSize ?? 4}
max_client_conn = 500
logfile = ${path.join(dir, 'pgbouncer.log')}
ignore_startup_parameters = extra_float_digits,options,application_name
${Object.entries(options.settings ?? {})
  .map(([name, value]) => `${name} = ${value}`)
  .join('\n')}
`
  // PgBouncer cannot bind port 0 and say which port it got: it gets a port that was free a moment ago, and another
  // one when something took that port before PgBouncer bound it.
  let started: Started | undefined
  for (let tries = 1; !started; tries++) {
    try {
      started = await spawnPgBouncer(binary, dir, config(await (options.pickPort ?? freePort)()))
    } catch (error) {
      if (error instanceof PortInUseError && tries < PORT_TRIES) continue
      rmSync(dir, { recursive: true, force: true })
      throw error
    }
  }
  const { port } = started
  let { child } = started
  const stopChild = async (signal: NodeJS.Signals) => {
    if (child.exitCode !== null || child.signalCode !== null) return
    const running = child
    const done = new Promise<void>((resolve) => running.once('exit', () => resolve()))
    running.kill(signal)
    // A safe shutdown waits for every server connection to be released, which a stalled transaction can hold off
    // indefinitely: then it is shut down immediately.
    const impatient = setTimeout(() => running.kill('SIGTERM'), SAFE_SHUTDOWN_MS)
    await done.finally(() => clearTimeout(impatient))
  }
  return {
    port,
    async restart(how) {
      await stopChild(how === 'clean' ? 'SIGINT' : 'SIGKILL')
      // The port is ours until the new process binds it, but another process may take it meanwhile: try again
      // for a while, since the clients are configured with this port and cannot follow another one.
      for (let tries = 1; ; tries++) {
        try {
          child = (await spawnPgBouncer(binary, dir, config(port))).child
          return
        } catch (error) {
          if (!(error instanceof PortInUseError) || tries >= RESTART_TRIES) throw error
          await new Promise((resolve) => setTimeout(resolve, 100))
        }
      }
    },
    url: (database) => {
      const url = new URL(withDatabase(target.toString(), database))
      url.hostname = '127.0.0.1'
      url.port = String(port)
      return url.toString()
    },
    async stop() {
      await stopChild('SIGTERM')
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** How many ports a start tries before it gives up. */
const PORT_TRIES = 5

/** How long a clean restart waits for the transactions in progress before it shuts PgBouncer down at once. */
const SAFE_SHUTDOWN_MS = 10_000

/** How many times a restart tries to bind its port again (100 ms apart) before it gives up. */
const RESTART_TRIES = 50

/** PgBouncer could not bind its port: something took it between the pick and the bind. */
class PortInUseError extends Error {}

interface Started {
  port: number
  child: ChildProcess
}

/**
 * Runs PgBouncer with `config` and resolves once it says it listens (its own log line first: a process that took
 * the port would answer a probe of it too).
 */
async function spawnPgBouncer(binary: string, dir: string, config: string): Promise<Started> {
  const file = path.join(dir, 'pgbouncer.ini')
  writeFileSync(file, config)
  const port = Number(/^listen_port = (\d+)$/m.exec(config)![1])
  // PgBouncer refuses to run as root: as root, run it as the `postgres` user, which must own its files.
  const asRoot = process.getuid?.() === 0
  if (asRoot) {
    const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim())
    const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim())
    chownSync(dir, uid, gid)
    chownSync(file, uid, gid)
  }
  const child = spawn(binary, [...(asRoot ? ['-u', 'postgres'] : []), file], {
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  let stderr = ''
  child.stderr?.on('data', (chunk) => {
    stderr += chunk
  })
  const exited = () => child.exitCode !== null || child.signalCode !== null
  try {
    await waitFor('pgbouncer to listen', () => {
      if (!exited()) return stderr.includes(`listening on 127.0.0.1:${port}`)
      if (/bind\(\): Address already in use/.test(stderr)) throw new PortInUseError(stderr)
      throw new Error(`pgbouncer exited: ${stderr}`)
    })
  } catch (error) {
    child.kill('SIGKILL')
    throw error
  }
  if (!(await accepts(port))) {
    child.kill('SIGKILL')
    throw new Error(`pgbouncer says it is up but does not accept connections on ${port}: ${stderr}`)
  }
  return { port, child }
}
