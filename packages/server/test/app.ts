import Fastify, { type FastifyInstance } from 'fastify'
import type pg from 'pg'
import { fastifyIdempotency } from '../src/fastify/index.js'
import type { TestingEngineOptions } from '../src/testing/index.js'
import { engineFor } from './helpers.js'

declare module 'fastify' {
  interface FastifyRequest {
    user: string
  }
}

/**
 * A small payments API on the test database: bearer-token auth (the token is the tenant), one idempotent route that
 * inserts a payment in the idempotency transaction, and a few routes for the edge cases.
 */
export async function buildApp(pool: pg.Pool, options: Partial<TestingEngineOptions> = {}) {
  const { engine, events } = engineFor(pool, options)
  const app: FastifyInstance = Fastify({ logger: false })
  app.decorateRequest('user', '')
  app.addHook('preHandler', async (request, reply) => {
    const auth = request.headers.authorization
    if (!auth?.startsWith('Bearer ')) return reply.code(401).send({ error: 'unauthorized' })
    request.user = auth.slice('Bearer '.length)
  })
  await app.register(fastifyIdempotency, { engine, tenant: (request) => request.user })

  app.post<
    { Body: { cart: string; amount: number; decline?: boolean; fail?: string; big?: number } },
    { idempotency: { required: true } }
  >(
    '/v1/payments',
    {
      config: {
        idempotency: { required: true, fingerprint: { exclude: ['clientTime'] }, maxBodyBytes: 1_024 },
      },
    },
    async (request, reply) => {
      const { tx } = request.idempotency
      const { cart, amount } = request.body
      if (request.body.fail === 'throw')
        throw Object.assign(new Error('provider timeout'), { statusCode: 504 })
      if (request.body.decline) {
        throw Object.assign(new Error('Your card was declined.'), { statusCode: 402, code: 'card_declined' })
      }
      const { rows } = await tx.query(
        'INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3) RETURNING id',
        [request.user, cart, amount],
      )
      const id = rows[0].id as string
      if (request.body.big) return reply.code(201).send({ id, padding: 'x'.repeat(request.body.big) })
      return reply
        .code(201)
        .header('location', `/v1/payments/${id}`)
        .header('set-cookie', 'session=abc')
        .header('etag', `"p${id}"`)
        .send({ id, cart, amount })
    },
  )

  // Returns a value instead of calling reply.send, and takes no key unless one is sent.
  app.post('/v1/notes', { config: { idempotency: { required: false } } }, async (request) => {
    await request.idempotency?.tx.query('SELECT 1')
    return { ok: true, keyed: Boolean(request.headers['idempotency-key']) }
  })

  return { app, engine, events }
}

export const auth = (tenant = 'tenant_1') => ({ authorization: `Bearer ${tenant}` })
