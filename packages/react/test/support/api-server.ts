import { createEngine, migrate, postgresStore } from '@oncely/server'
import { fastifyIdempotency } from '@oncely/server/fastify'
import { createTestDatabase } from '@oncely/test-support'
import Fastify from 'fastify'

/**
 * The real server side of the hook tests: @oncely/server's engine on a fresh Postgres database behind its Fastify
 * plugin, with one idempotent route, `POST /v1/payments`, that inserts a payment in the idempotency transaction
 * (`payments` has no unique constraint, so a second execution would be a second row). `{ workMs }` in the body
 * keeps that request busy. CORS is open, because the browser tests run on another origin.
 *
 * What it saw, for the tests' assertions: `GET /test/requests?key=` lists the POSTs that carried `key`, and
 * `GET /test/payments?key=` the payments executed for it.
 */
export async function startApiServer(label: string) {
  const db = await createTestDatabase(label)
  await migrate(db.pool)
  await db.pool.query(
    'CREATE TABLE payments (id bigserial PRIMARY KEY, idempotency_key text NOT NULL, amount integer NOT NULL)',
  )
  const engine = createEngine({ store: postgresStore({ pool: db.pool }) })
  const requests: { key: string; attempt: string }[] = []
  const app = Fastify({ logger: false })
  app.addHook('onRequest', async (request, reply) => {
    reply.header('access-control-allow-origin', '*')
    reply.header('access-control-expose-headers', 'idempotent-replayed, retry-after, location')
    if (request.method === 'OPTIONS') {
      return reply
        .code(204)
        .header('access-control-allow-methods', 'GET, POST')
        .header(
          'access-control-allow-headers',
          'content-type, idempotency-key, oncely-attempt, authorization',
        )
        .header('access-control-max-age', '600')
        .send()
    }
    if (request.method === 'POST') {
      requests.push({
        key: String(request.headers['idempotency-key']),
        attempt: String(request.headers['oncely-attempt']),
      })
    }
  })
  await app.register(fastifyIdempotency, { engine, tenant: () => 'tenant_1' })
  app.post<{ Body: { amount: number; workMs?: number } }, { idempotency: { required: true } }>(
    '/v1/payments',
    { config: { idempotency: { required: true } } },
    async (request, reply) => {
      const { amount, workMs = 0 } = request.body
      if (workMs > 0) await new Promise((resolve) => setTimeout(resolve, workMs))
      const { rows } = await request.idempotency.tx.query<{ id: string }>(
        'INSERT INTO payments (idempotency_key, amount) VALUES ($1, $2) RETURNING id',
        [request.idempotency.key, amount],
      )
      return reply.code(201).send({ id: String(rows[0]!.id), amount })
    },
  )
  app.get<{ Querystring: { key: string } }>('/test/requests', async (request) =>
    requests.filter((r) => r.key === request.query.key),
  )
  app.get<{ Querystring: { key: string } }>('/test/payments', async (request) => {
    const { rows } = await db.pool.query<{ id: string }>(
      'SELECT id::text FROM payments WHERE idempotency_key = $1 ORDER BY id',
      [request.query.key],
    )
    return rows.map((row) => row.id)
  })
  const url = await app.listen({ port: 0, host: '127.0.0.1' })
  return {
    url,
    async close() {
      await app.close()
      await db.drop()
    },
  }
}
