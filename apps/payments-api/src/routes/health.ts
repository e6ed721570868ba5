import type { FastifyInstance } from 'fastify'
import type pg from 'pg'

/**
 * `GET /healthz`: 200 when the database answers, 503 otherwise (so a load balancer stops sending traffic). While the
 * instance starts, 503 with `status: 'starting'` and what it waits for (`waitingFor()`).
 */
export function registerHealthRoute(
  app: FastifyInstance,
  pool: pg.Pool,
  waitingFor: () => string | undefined = () => undefined,
): void {
  app.get('/healthz', async (_request, reply) => {
    const reason = waitingFor()
    if (reason !== undefined) return reply.code(503).send({ status: 'starting', waitingFor: reason })
    try {
      await pool.query('SELECT 1')
      return { status: 'ok' }
    } catch {
      return reply.code(503).send({ status: 'unavailable', database: 'unreachable' })
    }
  })
}
