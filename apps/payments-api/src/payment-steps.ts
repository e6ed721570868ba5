/**
 * The payment as atomic phases (`@oncely/server/steps`): the provider charge is one step whose result commits as the
 * key's recovery point, and `finish` writes the payment and its outbox event on the transaction that completes the
 * key. A retry or takeover after a crash past the charge resumes from the recovery point and never calls the
 * provider again; a crash inside the charge step re-runs it with the same `stepKey`, which the provider dedupes.
 *
 * The handler knows nothing of Fastify, so a completer (`createCompleter` from `@oncely/server/steps`) could re-drive
 * an abandoned intent with it.
 */
import { randomUUID } from 'node:crypto'
import { PROBLEM_CONTENT_TYPE, type ProblemDetails } from '@oncely/protocol'
import type { ExecutionContext, HandlerResponse } from '@oncely/server'
import { type StepsOptions, steps } from '@oncely/server/steps'
import type pg from 'pg'
import type { Faults } from './faults.js'
import { recordPayment } from './ledger.js'
import { demoProblem } from './problems.js'
import { type Charge, type Provider, ProviderUnavailableError } from './provider.js'
import type { PaymentBody } from './routes/schemas.js'

/**
 * What the recovery point carries. `body` is the request body exactly as received, so a re-drive can rebuild the
 * request's fingerprint; `chargeId` and `chargeStatus` are the charge step's result.
 */
export interface PaymentState {
  tenantId: string
  body: PaymentBody
  chargeId?: string
  chargeStatus?: Charge['status']
}

/** Dependencies of {@link createPaymentHandler}. */
export interface PaymentHandlerOptions {
  /**
   * Pool of the steps' own transactions, where the recovery point commits. Not the pool whose connection holds the
   * request's business transaction when requests can exhaust it: each execution holds one and waits for the other.
   */
  stepsPool: pg.Pool
  provider: Provider
  faults: Faults
  /**
   * Builds the steps handler: `steps` from `@oncely/server/steps`, or its fault-injecting twin for the chaos suite.
   * @default steps
   */
  steps?: StepsFactory
}

/** What builds a payment's steps handler (`steps`, or the chaos suite's `faultySteps(faults)`). */
export type StepsFactory = (
  options: StepsOptions<PaymentState>,
) => (ctx: ExecutionContext) => Promise<HandlerResponse>

/** Step names are stable across deploys: they are stored in recovery points and derive the provider's keys. */
export const CHARGE_STEP = 'charge'

function problemResponse(details: ProblemDetails, headers: Record<string, string> = {}): HandlerResponse {
  return {
    status: details.status,
    headers: { 'content-type': PROBLEM_CONTENT_TYPE, ...headers },
    body: details,
  }
}

/**
 * Builds the engine handler of one payment request.
 *
 * @example
 * const handle = createPaymentHandler({ stepsPool, provider, faults })
 * await engine.execute({ ...request, handler: handle({ tenantId: 'acme', body: { amount: 1250, currency: 'eur' } }) })
 */
export function createPaymentHandler(options: PaymentHandlerOptions) {
  const { stepsPool, provider, faults } = options
  const build: StepsFactory = options.steps ?? steps<PaymentState>

  return (initialState: PaymentState) =>
    async (ctx: ExecutionContext): Promise<HandlerResponse> => {
      const handler = build({
        pool: stepsPool,
        initialState,
        steps: [
          {
            name: CHARGE_STEP,
            // A decline is the provider's final answer for this key, kept like a charge; `finish` turns it into a 402.
            // No `compensate`: nothing after the charge fails permanently, so there is never a charge to refund.
            run: async ({ stepKey, state }) => {
              const { amount, currency, card } = state.body
              // A refused card throws CardDeclinedError (402): the engine stores it as a permanent failure.
              const charge = await provider.charge({
                stepKey,
                tenantId: state.tenantId,
                amount,
                currency,
                ...(card === undefined ? {} : { card }),
              })
              return { chargeId: charge.chargeId, chargeStatus: charge.status }
            },
          },
        ],
        finish: async ({ tx, state }) => {
          const chargeId = state.chargeId as string
          if (state.chargeStatus === 'declined') {
            return problemResponse(
              demoProblem('payment_declined', 'Amounts above 1000000 are declined.', { chargeId }),
            )
          }
          const { amount, currency } = state.body
          // The last line of defence: when the key expired before this retry, the charge above is the one the
          // first attempt took, and the ledger already holds its payment; answer with it, exactly as the first
          // attempt did, and announce nothing new.
          const { created, payment } = await recordPayment(tx, {
            tenantId: state.tenantId,
            amount,
            currency,
            reference: state.body.reference ?? null,
            chargeId,
            idempotencyKey: ctx.key || null,
          })
          if (created) {
            await tx.query(
              'INSERT INTO outbox (id, tenant_id, topic, aggregate_id, payload) VALUES ($1, $2, $3, $4, $5)',
              [
                randomUUID(),
                state.tenantId,
                'payment.succeeded',
                payment.id,
                JSON.stringify({ tenantId: state.tenantId, ...payment }),
              ],
            )
          }
          await faults.at('after-business-write')
          return { status: 201, headers: { location: `/v1/payments/${payment.id}` }, body: payment }
        },
      })
      try {
        return await handler(ctx)
      } catch (error) {
        if (!(error instanceof ProviderUnavailableError)) throw error
        // A 5xx is not stored and no recovery point was saved (the step rolled back): the key is released and the
        // retry runs the charge step again with the same key, so the provider returns any charge it already took.
        return problemResponse(demoProblem('provider_unavailable', error.message), {
          'retry-after': String(Math.ceil(error.retryAfterMs / 1000)),
        })
      }
    }
}
