// The store's side lane: a few connections of its own for the statements that must commit on their own while an
// attempt holds its business connection open (a recovery point saved without a transaction, a renewed lease).
//
// Why not the store's pool: every attempt holds one connection of that pool from its reservation to its answer. If
// such a statement asked the same pool for a second connection, a burst of pool-size attempts would each hold one
// and wait for another, and nothing would ever answer again (pg's `connectionTimeoutMillis` is 0 by default). A
// side-lane connection is held for one statement and waits on nothing, so a wait for it always ends.
import pg from 'pg'

/** Connections the side lane may open: its statements are single autocommit writes, a few milliseconds each. */
export const SIDE_LANE_CONNECTIONS = 2

/** How long an idle side-lane connection is kept: long enough for a burst of renewals, short enough to go away. */
const SIDE_LANE_IDLE_MS = 10_000

const lanes = new WeakMap<pg.Pool, pg.Pool>()
const ignore = () => {}

/**
 * The side lane of `pool`: a pool of at most {@link SIDE_LANE_CONNECTIONS} connections, opened lazily with the same
 * connection settings (and the same `pg.Pool` class) as `pool`, whose idle connections close after a few seconds and
 * never keep the process alive. One per pool, shared by every engine and layer on it.
 */
export function sideLane(pool: pg.Pool): pg.Pool {
  let lane = lanes.get(pool)
  if (!lane) {
    const Pool = (typeof pool.constructor === 'function' ? pool.constructor : pg.Pool) as typeof pg.Pool
    lane = new Pool({
      ...pool.options,
      max: SIDE_LANE_CONNECTIONS,
      min: 0,
      idleTimeoutMillis: SIDE_LANE_IDLE_MS,
      allowExitOnIdle: true,
    })
    // An idle side connection that loses its server (a restart, a failover) must not crash the process.
    lane.on('error', ignore)
    lane.on('connect', (client) => client.on('error', ignore))
    lanes.set(pool, lane)
  }
  return lane
}
