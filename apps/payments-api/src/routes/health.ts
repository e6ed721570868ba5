import type { FastifyInstance } from 'fastify'
import type pg from 'pg'

/** `GET /healthz`: 200 when the database answers, 503 otherwise (so a load balancer stops sending traffic). */
export function registerHealthRoute(app: FastifyInstance, pool: pg.Pool): void {
  app.get('/healthz', { config: { public: true } }, async (_request, reply) => {
    try {
      await pool.query('SELECT 1')
      return { status: 'ok' }
    } catch {
      return reply.code(503).send({ status: 'unavailable', database: 'unreachable' })
    }
  })
}
