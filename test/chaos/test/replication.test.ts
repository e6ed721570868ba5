/**
 * The failover fault's cluster on real Postgres servers and real streaming replication: under `async` a commit the
 * standby had not received when the primary crashed is lost; under `sync` that commit never returned, and everything
 * that did survives. After a failover a new standby is built, so the cluster can fail over again.
 */
import { spawn } from 'node:child_process'
import { chmodSync, existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import pg from 'pg'
import { afterAll, describe, expect, it } from 'vitest'
import { ReplicatedCluster, type Replication } from '../src/replication.js'

const SCRIPT = resolve(import.meta.dirname, '../../../scripts/pg-server.mjs')
const dir = mkdtempSync(join(tmpdir(), 'oncely-replication-'))
chmodSync(dir, 0o755) // as root, the servers run as the `postgres` OS user
afterAll(() => rmSync(dir, { recursive: true, force: true }))

async function withClient<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  client.on('error', () => {})
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end().catch(() => {})
  }
}

const rows = (cluster: ReplicatedCluster) =>
  withClient(cluster.url, async (c) => (await c.query('SELECT n FROM t ORDER BY n')).rows.map((r) => r.n))

async function startCluster(
  replication: Replication,
  name: string = replication,
): Promise<ReplicatedCluster> {
  const cluster = await ReplicatedCluster.start({
    dir: join(dir, name),
    logDir: join(dir, name, 'logs'),
    replication,
  })
  await withClient(cluster.url, (c) => c.query('CREATE TABLE t (n int); INSERT INTO t VALUES (1)'))
  // Under `async` the setup returns before the standby has it: the test's own loss must be the only one.
  await replayedEverywhere(cluster)
  return cluster
}

/** Resolves once a standby has replayed all the WAL the primary has written so far. */
async function replayedEverywhere(cluster: ReplicatedCluster, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  const caughtUp = () =>
    withClient(cluster.url, async (c) => {
      const { rows } = await c.query(
        'SELECT count(*)::int AS n FROM pg_stat_replication WHERE replay_lsn >= pg_current_wal_lsn()',
      )
      return rows[0].n > 0
    })
  while (!(await caughtUp())) {
    if (Date.now() > deadline) throw new Error('timed out waiting for the standby to replay the setup')
    await new Promise((r) => setTimeout(r, 100))
  }
}

describe.sequential('a primary with a streaming standby', () => {
  it('async: a commit the standby never received is lost by the failover, and the next failover works', async () => {
    const cluster = await startCluster('async')
    try {
      cluster.holdReplication()
      // Acknowledged by the primary, never streamed.
      await withClient(cluster.url, (c) => c.query('INSERT INTO t VALUES (2)'))
      const first = await cluster.failover()
      expect(first.walLostBytes).toBeGreaterThan(0)
      expect(await rows(cluster)).toEqual([1])

      await withClient(cluster.url, (c) => c.query('INSERT INTO t VALUES (3)'))
      await waitFor(() => cluster.standbyReady)
      const second = await cluster.failover()
      expect(second.walLostBytes).toBe(0)
      expect(await rows(cluster)).toEqual([1, 3])
    } finally {
      await cluster.dispose()
    }
  }, 180_000)

  it('sync: a commit the standby has not flushed does not return, and what returned survives', async () => {
    const cluster = await startCluster('sync')
    try {
      cluster.holdReplication()
      const blocked = withClient(cluster.url, (c) => c.query('INSERT INTO t VALUES (2)'))
      const outcome = await Promise.race([
        blocked.then(
          () => 'committed',
          () => 'failed',
        ),
        new Promise((resolve) => setTimeout(() => resolve('waiting'), 1000)),
      ])
      expect(outcome).toBe('waiting')
      await cluster.failover()
      await expect(blocked).rejects.toThrow()
      expect(await rows(cluster)).toEqual([1])
      // The new primary has no standby yet, so it commits on its own; the rebuilt standby becomes synchronous.
      await withClient(cluster.url, (c) => c.query('INSERT INTO t VALUES (3)'))
      await waitFor(() => cluster.standbyReady)
      await cluster.failover()
      expect(await rows(cluster)).toEqual([1, 3])
    } finally {
      await cluster.dispose()
    }
  }, 180_000)
})

describe('scripts/pg-server.mjs', () => {
  it('exits on SIGTERM only once its Postgres has stopped (regression: a restart found the old postmaster.pid)', async () => {
    const data = join(dir, 'sigterm')
    for (let round = 0; round < 3; round++) {
      const server = spawn(process.execPath, [SCRIPT, '--dir', data, '--persistent'], {
        stdio: ['pipe', 'pipe', 'inherit'],
      })
      const url = await new Promise<string>((resolve, reject) => {
        createInterface({ input: server.stdout }).on('line', (line) => {
          if (line.startsWith('READY ')) resolve(line.slice('READY '.length))
        })
        server.once('exit', (code) => reject(new Error(`pg-server exited with ${code}`)))
      })
      // Work for the shutdown checkpoint to write.
      await withClient(url, (c) =>
        c.query(
          'CREATE TABLE IF NOT EXISTS w (n int); INSERT INTO w SELECT g FROM generate_series(1, 200000) g',
        ),
      )
      const exited = new Promise<number | null>((resolve) => server.once('exit', (code) => resolve(code)))
      server.kill('SIGTERM')
      expect(await exited).toBe(0)
      expect(existsSync(join(data, 'postmaster.pid'))).toBe(false)
    }
  }, 180_000)
})

describe('a restart of the primary', () => {
  it('brings the primary back with what it had, with a client connected while it stops', async () => {
    const cluster = await startCluster('sync', 'restart')
    try {
      for (let round = 0; round < 3; round++) {
        // Work for the shutdown checkpoint to write, and a client connected while it happens.
        await withClient(cluster.url, (c) =>
          c.query('INSERT INTO t SELECT g FROM generate_series(1, 200000) g'),
        )
        const held = new pg.Client({ connectionString: cluster.url })
        held.on('error', () => {})
        await held.connect()
        await cluster.restartPrimary()
        await held.end().catch(() => {})
      }
      expect((await rows(cluster)).length).toBe(1 + 3 * 200_000)
    } finally {
      await cluster.dispose()
    }
  }, 180_000)
})

async function waitFor(condition: () => boolean, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('timed out')
    await new Promise((r) => setTimeout(r, 100))
  }
}
