/**
 * `POST /v1/payments` and `GET /v1/payments/:id`.
 *
 * The POST handler is the protocol's "execute" step: charge the provider with a key derived from the idempotency
 * key (so a re-execution after a crash or a transient failure cannot charge twice), then write the payment and its
 * outbox event on the transaction that also completes the key record, so both commit or neither does.
 */
import { randomUUID } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type pg from 'pg'
import type { Faults } from '../faults.js'
import { demoProblem, sendProblem } from '../problems.js'
import { type Provider, ProviderUnavailableError } from '../provider.js'
import { type PaymentBody, paymentBodySchema } from './schemas.js'

/** A payment as the API returns it. */
export interface Payment {
  id: string
  amount: number
  currency: string
  reference: string | null
  status: 'succeeded'
  chargeId: string
}

/** What the POST handler needs from the idempotency layer (or, with it disabled, from a plain transaction). */
export interface PaymentExecution {
  /** The transaction that commits with the key record. */
  tx: pg.PoolClient
  /** The idempotency key, stored with the payment for the chaos checker. */
  key: string | undefined
  /** The provider's idempotency key for a step of this execution. */
  stepKey(step: string): string
}

/** Dependencies of {@link registerPaymentRoutes}. */
export interface PaymentRoutesOptions {
  pool: pg.Pool
  provider: Provider
  faults: Faults
  /** Supplies the execution context of a POST; differs with idempotency on (the default) or off (chaos only). */
  execution: PaymentExecutionSource
}

/** How the POST route gets its transaction: from the idempotency adapter, or from a plain transaction. */
export interface PaymentExecutionSource {
  /** Route options to merge into the POST route (the adapter's per-route opt-in). */
  routeConfig: Record<string, unknown>
  /** Runs `work` with the request's execution context. */
  run(
    request: FastifyRequest,
    work: (execution: PaymentExecution) => Promise<Payment | undefined>,
  ): Promise<Payment | undefined>
}

interface PaymentRow {
  id: string
  amount: string
  currency: string
  reference: string | null
  charge_id: string
}

function toPayment(row: PaymentRow): Payment {
  return {
    id: row.id,
    amount: Number(row.amount),
    currency: row.currency,
    reference: row.reference,
    status: 'succeeded',
    chargeId: row.charge_id,
  }
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** Registers the payment routes. */
export function registerPaymentRoutes(app: FastifyInstance, options: PaymentRoutesOptions): void {
  const { pool, provider, faults, execution } = options

  app.post<{ Body: PaymentBody }>(
    '/v1/payments',
    { schema: { body: paymentBodySchema }, config: execution.routeConfig },
    // The work resolves with the payment to send, or with undefined once it has sent a problem itself.
    async (request, reply) =>
      execution.run(request, async ({ tx, key, stepKey }): Promise<Payment | undefined> => {
        const { amount, currency } = request.body
        const reference = request.body.reference ?? null
        let charge: Awaited<ReturnType<Provider['charge']>>
        try {
          charge = await provider.charge({
            stepKey: stepKey('charge'),
            tenantId: request.tenant,
            amount,
            currency,
          })
        } catch (error) {
          if (!(error instanceof ProviderUnavailableError)) throw error
          // A 5xx is not stored: the key is released and the client's retry re-executes; the step key makes the
          // provider return the charge it may already have taken.
          reply.header('Retry-After', String(Math.ceil(error.retryAfterMs / 1000)))
          sendProblem(reply, demoProblem('provider_unavailable', error.message))
          return undefined
        }
        await faults.at('after-provider')
        if (charge.status === 'declined') {
          // A decline is a final answer for this key: stored and replayed, never charged again.
          sendProblem(
            reply,
            demoProblem('payment_declined', 'Amounts above 1000000 are declined.', {
              chargeId: charge.chargeId,
            }),
          )
          return undefined
        }
        const id = randomUUID()
        const { rows } = await tx.query<PaymentRow>(
          `INSERT INTO payments (id, tenant_id, amount, currency, reference, charge_id, idempotency_key)
           VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id, amount, currency, reference, charge_id`,
          [id, request.tenant, amount, currency, reference, charge.chargeId, key ?? null],
        )
        const payment = toPayment(rows[0]!)
        await tx.query('INSERT INTO outbox (id, topic, aggregate_id, payload) VALUES ($1, $2, $3, $4)', [
          randomUUID(),
          'payment.succeeded',
          id,
          JSON.stringify({ tenantId: request.tenant, ...payment }),
        ])
        await faults.at('after-business-write')
        reply.code(201).header('Location', `/v1/payments/${id}`)
        return payment
      }),
  )

  app.get<{ Params: { id: string } }>('/v1/payments/:id', async (request, reply) => {
    const { id } = request.params
    if (UUID.test(id)) {
      const { rows } = await pool.query<PaymentRow>(
        'SELECT id, amount, currency, reference, charge_id FROM payments WHERE id = $1 AND tenant_id = $2',
        [id, request.tenant],
      )
      if (rows[0]) return toPayment(rows[0])
    }
    // Another tenant's payment is "not found", not "forbidden": its existence is not ours to reveal.
    return sendProblem(reply, demoProblem('not_found', `No payment ${id}.`))
  })
}
