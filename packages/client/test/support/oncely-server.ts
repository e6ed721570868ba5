import { createEngine, migrate, postgresStore } from '@oncely/server'
import { fastifyIdempotency } from '@oncely/server/fastify'
import { createTestDatabase } from '@oncely/test-support'
import Fastify from 'fastify'

/**
 * The real server side for end-to-end tests: @oncely/server's engine on a fresh Postgres database behind its Fastify
 * plugin, with one idempotent route that inserts a payment in the idempotency transaction. `payments` has no unique
 * constraint, so a second execution would show up as a second row (each row names the key it was made under).
 *
 * `dropResponses` lets the engine commit and then destroys the socket instead of writing the response (the lost
 * response); it applies to replays too. `unavailable` answers 503 before the engine sees the request (no effect).
 * `workMs` keeps the handler busy inside its transaction. `files` are served on GET (pages for browser tests).
 * `handled` counts the requests that reached the handler: the engine held their key from then until their answer.
 * A payment whose `card` is in `declined` is answered 402 (stored by the engine as the key's final outcome).
 */
export async function startOncelyServer(label: string) {
  const db = await createTestDatabase(label)
  await migrate(db.pool)
  await db.pool.query('CREATE TABLE payments (id bigserial PRIMARY KEY, amount integer NOT NULL, key text)')
  const engine = createEngine({ store: postgresStore({ pool: db.pool }) })
  const app = Fastify({ logger: false })
  const state = {
    dropResponses: false,
    unavailable: false,
    workMs: 0,
    keys: [] as (string | undefined)[],
    handled: 0,
    declined: new Set<string>(),
    files: new Map<string, { type: string; body: string }>(),
  }
  app.get('/*', async (request, reply) => {
    const file = state.files.get(request.url.split('?')[0]!)
    if (!file) return reply.code(404).send()
    return reply.type(file.type).header('cache-control', 'no-store').send(file.body)
  })
  app.addHook('onRequest', async (request, reply) => {
    if (request.method !== 'POST') return
    const key = request.headers['idempotency-key']
    state.keys.push(Array.isArray(key) ? key.join(', ') : key)
    if (state.unavailable) return reply.code(503).send({ title: 'unavailable', status: 503 })
    if (!state.dropResponses) return
    // The response is written only after the engine committed (the plugin holds it until then); drop it there.
    const raw = reply.raw
    raw.writeHead = (() => {
      raw.socket?.destroy()
      return raw
    }) as typeof raw.writeHead
  })
  await app.register(fastifyIdempotency, { engine, tenant: () => 'tenant_1' })
  app.post<{ Body: { amount: number; card?: string } }, { idempotency: { required: true } }>(
    '/v1/payments',
    { config: { idempotency: { required: true } } },
    async (request, reply) => {
      state.handled++
      if (state.workMs > 0) await new Promise((resolve) => setTimeout(resolve, state.workMs))
      if (request.body.card !== undefined && state.declined.has(request.body.card)) {
        return reply.code(402).send({ title: 'Card declined', status: 402, card: request.body.card })
      }
      const { rows } = await request.idempotency.tx.query(
        'INSERT INTO payments (amount, key) VALUES ($1, $2) RETURNING id',
        [request.body.amount, request.headers['idempotency-key']],
      )
      return reply.code(201).send({ id: String(rows[0].id), amount: request.body.amount })
    },
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  const address = app.server.address() as { port: number }
  return Object.assign(state, {
    url: `http://127.0.0.1:${address.port}`,
    effects: async () => (await db.pool.query('SELECT count(*)::int AS n FROM payments')).rows[0].n as number,
    /** The payments made under one idempotency key. */
    effectsFor: async (key: string) =>
      (await db.pool.query('SELECT count(*)::int AS n FROM payments WHERE key = $1', [key])).rows[0]
        .n as number,
    async close() {
      await app.close()
      await db.drop()
    },
  })
}
