// A reference point, not a product: the SQL of `reservation: 'lock'` written by hand in the route, with no plugin
// and no engine (no strict JSON parsing, no response capture, no replay cache, no events, no fence, no error
// handling beyond a 409 and a replay of the stored body). It measures the floor any layer pays for keeping its key
// in the business Postgres, in the same transaction, with a prompt 409: the database work apart from the library's.
import { createHash } from 'node:crypto'
import { migrate } from '@oncely/server'
import type pg from 'pg'
import { insertEntry, type Transfer } from './ledger.js'
import type { Variant } from './variant.js'

const SCHEMA = 'oncely_floor'
const literal = (value: string) => `'${value.replaceAll("'", "''")}'`

/** How the floor takes the key's lock and reads its row: the SQL text that does it, given the key's three parts. */
export type FloorReservation = (id: string) => string

/**
 * The floor's statements on `table`: the PREPAREs each connection runs once, the two ways of reserving, and the
 * finish of a new key. `id` is the key's three parts as SQL literals, `'scope', 'operation', 'key'`.
 */
export function floorSql(table: string) {
  const lockKey = `hashtextextended($1 || '|' || $2 || '|' || $3, 0)`
  const row = `k.status, k.response_status, k.response_body`
  return {
    prepares: [
      `PREPARE floor_lock(text, text, text) AS SELECT pg_try_advisory_xact_lock(${lockKey}) AS locked`,
      `PREPARE floor_lookup(text, text, text) AS SELECT ${row} FROM ${table} AS k WHERE k.scope = $1 AND k.operation = $2 AND k.key = $3`,
      `PREPARE floor_lock_lookup(text, text, text) AS SELECT pg_try_advisory_xact_lock(${lockKey}) AS locked, ${row} FROM (SELECT 1) AS one LEFT JOIN ${table} AS k ON k.scope = $1 AND k.operation = $2 AND k.key = $3`,
      `PREPARE floor_finish(text, text, text, text, integer, jsonb, bytea) AS INSERT INTO ${table} (scope, operation, key, fingerprint, status, attempts, created_at, updated_at, expires_at, response_status, response_headers, response_body) VALUES ($1, $2, $3, $4, 'succeeded', 1, now(), now(), now() + interval '1 day', $5, $6, $7)`,
    ],
    reserve: {
      /**
       * The lock, then the row in a statement of its own, as the lock protocol must: a statement reads the snapshot
       * taken when it began, so a row read in the statement that waited for the lock can miss the commit of the
       * attempt that held it, and the key would run again (here: a unique violation, a 500).
       */
      separate: ((id) => `BEGIN; EXECUTE floor_lock(${id}); EXECUTE floor_lookup(${id})`) as FloorReservation,
      /** The lock and the row in one statement: one statement fewer, and the race above. Measured, never the floor. */
      oneStatement: ((id) => `BEGIN; EXECUTE floor_lock_lookup(${id})`) as FloorReservation,
    },
    finish: (id: string, fingerprint: string, bodyHex: string) =>
      `EXECUTE floor_finish(${id}, ${literal(fingerprint)}, 201, '{"content-type":"application/json"}', decode('${bodyHex}', 'hex')); COMMIT`,
  }
}

const SQL = floorSql(`${SCHEMA}.idempotency_keys`)
/** The connections that prepared the floor's statements (a pool's connections serve every floor variant). */
const prepared = new WeakSet<pg.ClientBase>()

/** The result of a reservation: whether the lock was taken, and the key's row if the lookup found one. */
function reservationOf(results: pg.QueryResult[]): {
  locked: boolean
  row: { status: string; response_status: number; response_body: Buffer } | undefined
} {
  // results[0] is BEGIN's; then the lock's (with the row, in one statement) and the lookup's.
  const lock = results[1]?.rows[0]
  const row = results.length > 2 ? results[2]?.rows[0] : lock?.status ? lock : undefined
  return { locked: lock?.locked === true, row }
}

function floorVariant(name: string, description: string, reserve: FloorReservation): Variant {
  return {
    name,
    description,
    async setup(scope, { pool }) {
      await migrate(pool, { schema: SCHEMA })
      scope.post<{ Body: Transfer }>('/ledger', async (request, reply) => {
        const key = request.headers['idempotency-key']
        if (typeof key !== 'string') return reply.code(400).send({})
        const fingerprint = createHash('sha256').update(JSON.stringify(request.body)).digest('hex')
        const id = `'bench', 'POST /ledger', ${literal(key)}`
        const client = await pool.connect()
        try {
          if (!prepared.has(client)) {
            for (const text of SQL.prepares) await client.query(text)
            prepared.add(client)
          }
          const { locked, row } = reservationOf(
            (await client.query(reserve(id))) as unknown as pg.QueryResult[],
          )
          if (row?.status === 'succeeded') {
            await client.query('ROLLBACK')
            return reply
              .code(row.response_status)
              .header('content-type', 'application/json; charset=utf-8')
              .send(row.response_body)
          }
          if (!locked || row) {
            await client.query('ROLLBACK')
            return reply.code(409).send({})
          }
          const response = await insertEntry(client, key, request.body)
          const body = Buffer.from(JSON.stringify(response.body))
          await client.query(SQL.finish(id, fingerprint, body.toString('hex')))
          return reply.code(response.status).send(response.body)
        } catch (error) {
          await client.query('ROLLBACK').catch(() => {})
          throw error
        } finally {
          client.release()
        }
      })
      return async () => {}
    },
  }
}

export const sqlFloor = floorVariant(
  'sql-floor',
  "reference: reservation: 'lock' SQL by hand in the route (the lock, then the row), no plugin, no engine",
  SQL.reserve.separate,
)

export const sqlFloorOneStatement = floorVariant(
  'sql-floor-one-statement',
  'reference, unsafe: sql-floor with the lock and the row in one statement (a duplicate can miss a commit)',
  SQL.reserve.oneStatement,
)
