/**
 * The failover fault's cluster on real Postgres servers and real streaming replication: under `async` a commit the
 * standby had not received when the primary crashed is lost; under `sync` that commit never returned, and everything
 * that did survives. After a failover a new standby is built, so the cluster can fail over again.
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { afterAll, describe, expect, it } from 'vitest'
import { ReplicatedCluster, type Replication } from '../src/replication.js'

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

async function startCluster(replication: Replication): Promise<ReplicatedCluster> {
  const cluster = await ReplicatedCluster.start({
    dir: join(dir, replication),
    logDir: join(dir, replication, 'logs'),
    replication,
  })
  await withClient(cluster.url, (c) => c.query('CREATE TABLE t (n int); INSERT INTO t VALUES (1)'))
  return cluster
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

async function waitFor(condition: () => boolean, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('timed out')
    await new Promise((r) => setTimeout(r, 100))
  }
}
