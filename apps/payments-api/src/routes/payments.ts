/**
 * `POST /v1/payments` and `GET /v1/payments/:id`.
 *
 * The POST handler is the protocol's "execute" step, as atomic phases (see `payment-steps.ts`): the provider charge
 * commits as a recovery point, then the payment and its outbox event commit with the key record.
 */
import type { ExecutionContext, HandlerResponse } from '@oncely/server'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type pg from 'pg'
import { findPayment } from '../ledger.js'
import type { PaymentState } from '../payment-steps.js'
import { demoProblem, sendProblem } from '../problems.js'
import { type PaymentBody, paymentBodySchema } from './schemas.js'

/** Dependencies of {@link registerPaymentRoutes}. */
export interface PaymentRoutesOptions {
  pool: pg.Pool
  /** The engine handler of one payment (`createPaymentHandler(...)`). */
  handle: (state: PaymentState) => (ctx: ExecutionContext) => Promise<HandlerResponse>
  /** Supplies the execution context of a POST; differs with idempotency on (the default) or off (chaos only). */
  execution: PaymentExecutionSource
}

/** How the POST route gets its execution context: from the idempotency adapter, or from a plain transaction. */
export interface PaymentExecutionSource {
  /** Route options to merge into the POST route (the adapter's per-route opt-in). */
  routeConfig: Record<string, unknown>
  /** Runs `work` with the request's execution context. */
  run(
    request: FastifyRequest,
    work: (ctx: ExecutionContext) => Promise<HandlerResponse>,
  ): Promise<HandlerResponse>
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** Registers the payment routes. */
export function registerPaymentRoutes(app: FastifyInstance, options: PaymentRoutesOptions): void {
  const { pool, handle, execution } = options

  app.post<{ Body: PaymentBody }>(
    '/v1/payments',
    { schema: { body: paymentBodySchema }, config: execution.routeConfig },
    async (request, reply) => {
      const response = await execution.run(request, handle({ tenantId: request.tenant, body: request.body }))
      for (const [name, value] of Object.entries(response.headers ?? {})) reply.header(name, value)
      return reply.code(response.status ?? 200).send(response.body)
    },
  )

  app.get<{ Params: { id: string } }>('/v1/payments/:id', async (request, reply) => {
    const { id } = request.params
    const payment = UUID.test(id) ? await findPayment(pool, request.tenant, id) : undefined
    if (payment) return payment
    // Another tenant's payment is "not found", not "forbidden": its existence is not ours to reveal.
    return sendProblem(reply, demoProblem('not_found', `No payment ${id}.`))
  })
}
