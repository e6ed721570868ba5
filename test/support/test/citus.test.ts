import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import {
  type CitusCluster,
  type CitusTestDatabase,
  createCitusTestDatabase,
  requireCitus,
  startCitusCluster,
} from '../src/index.js'

describe.skipIf(!requireCitus('the Citus cluster helper'))(
  'startCitusCluster and createCitusTestDatabase',
  () => {
    let cluster: CitusCluster
    let db: CitusTestDatabase
    beforeAll(async () => {
      cluster = await startCitusCluster()
      db = await createCitusTestDatabase('support_citus', { cluster: cluster.url })
    })
    afterAll(async () => {
      await db?.drop()
      await cluster?.stop()
    })

    it('starts a coordinator and two workers, registered in each fresh database', async () => {
      expect(cluster.nodes.map((n) => n.name)).toEqual(['coordinator', 'worker1', 'worker2'])
      const { rows } = await db.pool.query<{ port: number }>(
        'SELECT nodeport AS port FROM pg_dist_node WHERE groupid <> 0 ORDER BY nodeport',
      )
      expect(rows.map((r) => r.port)).toEqual(
        cluster.nodes
          .slice(1)
          .map((n) => n.port)
          .sort((a, b) => a - b),
      )
    })

    it('spreads a distributed table over both workers', async () => {
      await db.pool.query('CREATE TABLE t (tenant text, id int, PRIMARY KEY (tenant, id))')
      await db.pool.query("SELECT create_distributed_table('t', 'tenant', shard_count => 4)")
      await db.pool.query("INSERT INTO t SELECT 'tenant' || i, i FROM generate_series(1, 100) i")
      const { rows } = await db.pool.query<{ nodeport: number }>(
        "SELECT DISTINCT nodeport FROM citus_shards WHERE table_name = 't'::regclass",
      )
      expect(rows).toHaveLength(2)
      expect((await db.pool.query('SELECT count(*)::int AS n FROM t')).rows[0].n).toBe(100)
    })

    it('restarts a worker, after which the cluster answers again', async () => {
      const before = cluster.nodes[1]!.pid
      await cluster.restart('worker1')
      expect(cluster.nodes[1]!.pid).not.toBe(before)
      await db.pool.query('SELECT 1') // a pooled connection may have lost its worker connection: a fresh query
      const { rows } = await db.pool.query('SELECT count(*)::int AS n FROM t')
      expect(rows[0].n).toBe(100)
    })
  },
)
