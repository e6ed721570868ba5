/**
 * A primary with a streaming standby, both real Postgres servers run by scripts/pg-server.mjs (the binaries the suite
 * uses for its own cluster), for the `failover` fault:
 *
 * ```
 *  clients ──▶ endpoint ──▶ primary ──▶ replication proxy ──▶ standby
 *             (retargeted                (hold(): the standby
 *              at failover)               falls behind)
 * ```
 *
 * `failover()` crashes the primary (an immediate shutdown: nothing more reaches the standby), promotes the standby
 * and points the endpoint at it, as a failover manager moves a virtual IP or a DNS name. Under `sync` replication
 * the primary commits only what the standby has flushed (`synchronous_standby_names` names it,
 * `synchronous_commit = on`), so nothing acknowledged is lost; under `async` whatever the standby had not received
 * is. After a failover a new standby is built from the new primary in the background, so a later failover can happen.
 */
import { chmodSync, mkdirSync, rmSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { ManagedProcess } from './processes.js'
import { FaultProxy } from './proxy.js'
import { createRandom } from './random.js'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..')
const USER = 'postgres:postgres'

/** How a primary's commits reach its standby. */
export type Replication = 'sync' | 'async'

export interface ClusterOptions {
  /** Where the nodes' data directories go. */
  dir: string
  /** Where the nodes' logs go. */
  logDir: string
  replication: Replication
  /** Run a standby at all: without one the cluster is a single server that can be restarted. @default true */
  standby?: boolean
  /** What the cluster does in the background (a standby rebuilt, or failing to be). @default ignore */
  log?: (line: string) => void
}

/** What a failover lost. */
export interface FailoverResult {
  /** Bytes of WAL the primary had written and the standby had not received when the primary crashed. */
  walLostBytes: number
  /**
   * From when commits may be lost (ms since the epoch): the last moment the primary's WAL was still no further than
   * what the standby received. Under asynchronous replication a standby can lag seconds behind on a loaded machine,
   * so this can be well before the failover began. Undefined when no sample was that old.
   */
  lostSince: number | undefined
}

/** How often the primary's WAL position is sampled, and how long samples are kept. */
const WAL_SAMPLE_MS = 200
const WAL_SAMPLES_KEPT_MS = 120_000

interface Node {
  process: ManagedProcess
  port: number
  dir: string
  /** The standby's replication slot and application name. */
  slot: string
}

export class ReplicatedCluster {
  readonly replication: Replication
  /** The primary's stable address: clients connect here, whichever server is primary. */
  readonly endpoint: FaultProxy
  readonly #stream: FaultProxy
  readonly #options: ClusterOptions
  #primary: Node
  #standby: Node | undefined
  #rebuilding: Promise<void> | undefined
  #generation = 0
  #disposed = false
  /** The primary's WAL position (bytes) no later than `at`: read after `at` was taken. */
  #walSamples: Array<{ at: number; lsn: bigint }> = []
  #sampler: NodeJS.Timeout | undefined
  #closeSampler: (() => void) | undefined

  private constructor(options: ClusterOptions, primary: Node, endpoint: FaultProxy, stream: FaultProxy) {
    this.#options = options
    this.replication = options.replication
    this.#primary = primary
    this.endpoint = endpoint
    this.#stream = stream
  }

  /** Starts a primary and its standby, and waits until the standby streams (and, under `sync`, is synchronous). */
  static async start(options: ClusterOptions): Promise<ReplicatedCluster> {
    if (options.replication !== 'sync' && options.replication !== 'async')
      throw new TypeError("Expected `replication` to be 'sync' or 'async'.")
    // As root, the servers run as the `postgres` OS user, which must be able to reach their directories.
    mkdirSync(options.dir, { recursive: true })
    chmodSync(options.dir, 0o755)
    const primary = await startNode(options, 'node-0')
    // Plain forwarders: no fault rates, so the random stream is never drawn from.
    const endpoint = await FaultProxy.start({
      name: 'postgres-endpoint',
      protocol: 'tcp',
      upstream: { port: primary.port },
      random: createRandom(0),
    })
    const stream = await FaultProxy.start({
      name: 'postgres-stream',
      protocol: 'tcp',
      upstream: { port: primary.port },
      random: createRandom(0),
    })
    const cluster = new ReplicatedCluster(options, primary, endpoint, stream)
    if (options.standby !== false) await cluster.#buildStandby()
    cluster.#sampleWal()
    return cluster
  }

  /** A connection string of the primary's `postgres` database through the endpoint. */
  get url(): string {
    return `postgres://${USER}@127.0.0.1:${this.endpoint.port}/postgres`
  }

  /** Whether a streaming standby is there to fail over to. */
  get standbyReady(): boolean {
    return this.#standby !== undefined
  }

  /** Whether a standby is being built from the primary now (it must not be restarted meanwhile). */
  get rebuilding(): boolean {
    return this.#rebuilding !== undefined
  }

  /** Makes the standby fall behind: the primary's WAL stops reaching it (see {@link FaultProxy.hold}). */
  holdReplication(): void {
    this.#stream.hold()
  }

  /**
   * Stops and starts the primary (a fast shutdown, as a restart). Not while a standby is being built from it. It
   * comes back on a port of its own (the endpoint and the replication stream follow it), so nothing else can have
   * taken its old one meanwhile.
   */
  async restartPrimary(): Promise<void> {
    if (this.#rebuilding) throw new Error('a standby is being built from the primary')
    const primary = this.#primary
    await primary.process.stop(30_000)
    await primary.process.start()
    primary.port = primary.process.port!
    this.endpoint.retarget({ port: primary.port })
    this.#stream.retarget({ port: primary.port })
  }

  /**
   * Crashes the primary, promotes the standby and points the endpoint at it; then builds a new standby in the
   * background. Resolves once the new primary accepts writes through the endpoint.
   */
  async failover(): Promise<FailoverResult> {
    const standby = this.#standby
    if (!standby) throw new Error('no standby to fail over to')
    const old = this.#primary
    const written = await query<{ lsn: string }>(old.port, 'SELECT pg_current_wal_lsn()::text AS lsn')
    // Immediate shutdown: no backend commits anything more, and what the stream held back is gone with it.
    await old.process.signalAndWait('SIGUSR1')
    this.#stream.killAll()
    this.#stream.release()
    const behind = await query<{ bytes: string; received: string }>(
      standby.port,
      `SELECT greatest(0, pg_wal_lsn_diff($1, pg_last_wal_receive_lsn()))::bigint::text AS bytes,
        pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '0/0')::bigint::text AS received`,
      [written.rows[0]!.lsn],
    )
    const received = BigInt(behind.rows[0]!.received)
    const lostSince = this.#walSamples.filter((sample) => sample.lsn <= received).at(-1)?.at
    this.#walSamples = []
    await query(standby.port, 'SELECT pg_promote(true, 60)')
    // A primary with no standby must not wait for one (the setting came with the base backup).
    await query(standby.port, 'ALTER SYSTEM RESET synchronous_standby_names')
    await query(standby.port, 'SELECT pg_reload_conf()')
    this.#primary = standby
    this.#standby = undefined
    this.endpoint.retarget({ port: standby.port })
    this.endpoint.killAll()
    this.#stream.retarget({ port: standby.port })
    await old.process.dispose()
    rmSync(old.dir, { recursive: true, force: true })
    this.#rebuilding = this.#buildStandby()
      .catch((error) => this.#options.log?.(`standby not rebuilt: ${(error as Error).message}`))
      .finally(() => {
        this.#rebuilding = undefined
      })
    return { walLostBytes: Number(behind.rows[0]!.bytes), lostSince }
  }

  /**
   * Samples the primary's WAL position until disposed, on one connection kept open (reopened after an error or a
   * failover); a sample that fails (the primary restarting) is skipped.
   */
  #sampleWal(): void {
    let sampler: { port: number; client: pg.Client } | undefined
    const close = () => {
      void sampler?.client.end().catch(() => {})
      sampler = undefined
    }
    this.#closeSampler = close
    const sample = async () => {
      const at = Date.now()
      const port = this.#primary.port
      if (sampler?.port !== port) {
        close()
        const client = new pg.Client({ connectionString: `postgres://${USER}@127.0.0.1:${port}/postgres` })
        client.on('error', () => {})
        sampler = { port, client }
        await client.connect()
      }
      const { rows } = await sampler.client.query<{ lsn: string }>(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint::text AS lsn",
      )
      // A failover meanwhile moved the primary: this sample is of the old one.
      if (port !== this.#primary.port) return
      this.#walSamples.push({ at, lsn: BigInt(rows[0]!.lsn) })
      while (this.#walSamples.length > 0 && this.#walSamples[0]!.at < at - WAL_SAMPLES_KEPT_MS)
        this.#walSamples.shift()
    }
    const next = () => {
      if (this.#disposed) return close()
      this.#sampler = setTimeout(() => void sample().catch(close).finally(next), WAL_SAMPLE_MS)
    }
    next()
  }

  /** Stops every server. */
  async dispose(): Promise<void> {
    this.#disposed = true
    clearTimeout(this.#sampler)
    this.#closeSampler?.()
    await this.#rebuilding
    await Promise.all([this.#standby?.process.dispose(), this.#primary.process.dispose()])
    await this.endpoint.close()
    await this.#stream.close()
  }

  async #buildStandby(): Promise<void> {
    if (this.#disposed) return
    const slot = `standby_${++this.#generation}`
    const primary = this.#primary
    const node = await startNode(this.#options, `node-${this.#generation}`, [
      '--standby-of',
      primary.dir,
      '--primary-port',
      String(this.#stream.port),
      '--slot',
      slot,
    ])
    try {
      await until(`${slot} to stream`, async () => (await replicationState(primary, slot)) !== undefined)
      if (this.replication === 'sync') {
        await query(primary.port, `ALTER SYSTEM SET synchronous_standby_names = '"${slot}"'`)
        await query(primary.port, 'SELECT pg_reload_conf()')
        await until(
          `${slot} to be synchronous`,
          async () => (await replicationState(primary, slot)) === 'sync',
        )
      }
    } catch (error) {
      await node.process.dispose()
      rmSync(node.dir, { recursive: true, force: true })
      throw error
    }
    if (this.#disposed) return void (await node.process.dispose())
    this.#standby = { ...node, slot }
  }
}

async function startNode(options: ClusterOptions, name: string, extra: string[] = []): Promise<Node> {
  const dir = join(options.dir, name)
  const process = new ManagedProcess({
    name: `postgres-${name}`,
    // --persistent: the data survives restarts (and fsync stays on, as in production). No --port: pg-server picks
    // one (another if it is taken before Postgres binds it) and names it on its READY line.
    args: [join(ROOT, 'scripts/pg-server.mjs'), '--dir', dir, '--persistent', ...extra],
    cwd: ROOT,
    logDir: options.logDir,
    ready: { port: /^READY postgres:\/\/\S+@127\.0\.0\.1:(\d+)\// },
    readyTimeoutMs: 120_000,
  })
  await process.start()
  return { process, port: process.port!, dir, slot: '' }
}

/** The standby's `sync_state` as its primary sees it while it streams, or undefined. */
async function replicationState(primary: Node, slot: string): Promise<string | undefined> {
  const { rows } = await query<{ sync_state: string }>(
    primary.port,
    "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'",
    [slot],
  )
  return rows[0]?.sync_state
}

/** One statement on a node, on a connection of its own (an admin's psql, not the application's pool). */
async function query<R extends pg.QueryResultRow>(
  port: number,
  text: string,
  values: unknown[] = [],
): Promise<pg.QueryResult<R>> {
  const client = new pg.Client({ connectionString: `postgres://${USER}@127.0.0.1:${port}/postgres` })
  client.on('error', () => {})
  await client.connect()
  try {
    return await client.query<R>(text, values)
  } finally {
    await client.end().catch(() => {})
  }
}

async function until(what: string, condition: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await condition().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}
