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
const T = `${SCHEMA}.idempotency_keys`
const literal = (value: string) => `'${value.replaceAll("'", "''")}'`
const prepared = new WeakSet<pg.ClientBase>()
const LOCK = `PREPARE floor_lock(text, text, text) AS SELECT pg_try_advisory_xact_lock(hashtextextended($1 || '|' || $2 || '|' || $3, 0)) AS locked, k.status, k.response_status, k.response_body FROM (SELECT 1) AS one LEFT JOIN ${T} AS k ON k.scope = $1 AND k.operation = $2 AND k.key = $3`
const FINISH = `PREPARE floor_finish(text, text, text, text, integer, jsonb, bytea) AS INSERT INTO ${T} (scope, operation, key, fingerprint, status, attempts, created_at, updated_at, expires_at, response_status, response_headers, response_body) VALUES ($1, $2, $3, $4, 'succeeded', 1, now(), now(), now() + interval '1 day', $5, $6, $7)`

export const sqlFloor: Variant = {
  name: 'sql-floor',
  description: "reference: reservation: 'lock' SQL by hand in the route, no plugin, no engine",
  async setup(scope, { pool }) {
    await migrate(pool, { schema: SCHEMA })
    scope.post<{ Body: Transfer }>('/ledger', async (request, reply) => {
      const key = request.headers['idempotency-key']
      if (typeof key !== 'string') return reply.code(400).send({})
      const fingerprint = createHash('sha256').update(JSON.stringify(request.body)).digest('hex')
      const client = await pool.connect()
      try {
        if (!prepared.has(client)) {
          await client.query(LOCK)
          await client.query(FINISH)
          prepared.add(client)
        }
        const results = (await client.query(
          `BEGIN; EXECUTE floor_lock('bench', 'POST /ledger', ${literal(key)})`,
        )) as unknown as pg.QueryResult[]
        const row = results[1]?.rows[0]
        if (row?.status === 'succeeded') {
          await client.query('ROLLBACK')
          return reply
            .code(row.response_status)
            .header('content-type', 'application/json; charset=utf-8')
            .send(row.response_body)
        }
        if (!row?.locked || row.status) {
          await client.query('ROLLBACK')
          return reply.code(409).send({})
        }
        const response = await insertEntry(client, key, request.body)
        const body = Buffer.from(JSON.stringify(response.body))
        await client.query(
          `EXECUTE floor_finish('bench', 'POST /ledger', ${literal(key)}, ${literal(fingerprint)}, 201, '{"content-type":"application/json"}', decode('${body.toString('hex')}', 'hex')); COMMIT`,
        )
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
