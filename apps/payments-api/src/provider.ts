/**
 * A simulated payment provider that behaves like a real one where it matters for idempotency:
 *
 * - Every charge carries the caller's idempotency key (a per-step key), and a repeated key returns the first charge
 *   instead of charging again, as Stripe does.
 * - It records charges on its own connection, outside the caller's transaction: a caller that rolls back or crashes
 *   after the call still has been charged. That is exactly why the caller must send a deterministic key.
 * - It can be slow, fail transiently (before or after taking the charge: a lost response is the case that needs
 *   its idempotency), and declines amounts above {@link DECLINE_ABOVE}.
 * - Like a real provider's test mode, a few {@link TEST_CARDS} pick an outcome per request: a card refused with a
 *   402 error (thrown, as a provider SDK throws its card errors), a processing error that loses the first answer,
 *   and a charge slower than the API's lease.
 */
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type pg from 'pg'

/** Amounts above this are declined (in the currency's minor unit). */
export const DECLINE_ABOVE = 1_000_000

/**
 * Cards that choose what the provider does with a charge, whatever the amount (any other card, or none, charges
 * normally):
 * - `declined`: refused with {@link CardDeclinedError} (HTTP 402); nothing is charged.
 * - `processingError`: the first call for a step key takes the charge, then fails with
 *   {@link ProviderUnavailableError} (its answer is lost); a retry with the same key gets that charge.
 * - `slow`: the charge takes `slowCardMs`.
 */
export const TEST_CARDS = {
  declined: '4000000000000002',
  processingError: '4000000000000119',
  slow: '4000000000000408',
} as const

/** A charge request. */
export interface ChargeRequest {
  /** The idempotency key of this charge; the same key always yields the same charge. */
  stepKey: string
  tenantId: string
  /** Minor units. */
  amount: number
  /** Three lowercase letters. */
  currency: string
  /** The card to charge; see {@link TEST_CARDS}. @default a card that charges normally */
  card?: string
}

/** What the provider answered. A decline is an answer, not an error: it is final for this key. */
export interface Charge {
  chargeId: string
  status: 'succeeded' | 'declined'
  /** False when the key was seen before and the first charge is returned. */
  created: boolean
}

/** A transient failure: nothing can be concluded about the charge; retry with the same key. */
export class ProviderUnavailableError extends Error {
  override name = 'ProviderUnavailableError' as const
  /** Suggested wait before retrying, in ms. */
  readonly retryAfterMs: number
  constructor(message: string, retryAfterMs = 1000) {
    super(message)
    this.retryAfterMs = retryAfterMs
  }
}

/** The card was refused: a final answer for this request, nothing was charged. Carries its HTTP status, 402. */
export class CardDeclinedError extends Error {
  override name = 'CardDeclinedError' as const
  readonly statusCode = 402
  constructor(message = 'The card was declined; nothing was charged.') {
    super(message)
  }
}

/**
 * The same key was sent again with a different amount or currency: a caller bug, as with a real provider. Final, like
 * a decline: the same request would be refused again. Carries its HTTP status, 422.
 */
export class ProviderKeyReusedError extends Error {
  override name = 'ProviderKeyReusedError' as const
  readonly statusCode = 422
}

/** Options of {@link createProvider}. */
export interface ProviderOptions {
  /** The provider's own pool; never the caller's transaction. */
  pool: pg.Pool
  /** Time each charge takes, in ms. @default 0 */
  delayMs?: number
  /** Probability of a transient failure per call, 0 to 1. @default 0 */
  failureRate?: number
  /**
   * Source of randomness in [0, 1), injectable so tests decide which call fails. A draw below `failureRate / 2`
   * fails before charging, a draw below `failureRate` fails after charging (the response is lost).
   * @default Math.random
   */
  random?: () => number
  /** How long a charge of {@link TEST_CARDS}`.slow` takes, in ms. @default 31000 (the API's default lease plus 1 s) */
  slowCardMs?: number
}

/** The provider's API. */
export interface Provider {
  /**
   * Charges once per `stepKey`.
   *
   * @throws {ProviderUnavailableError} transiently; a retry with the same key is safe.
   * @throws {CardDeclinedError} for a refused card; final.
   * @throws {ProviderKeyReusedError} when the key was used for another amount or currency.
   */
  charge(request: ChargeRequest): Promise<Charge>
  /** Number of charges recorded, for tests and the chaos checker. */
  countCharges(filter?: { tenantId?: string }): Promise<number>
}

/**
 * Creates the provider.
 *
 * @example
 * const provider = createProvider({ pool, delayMs: 200 })
 * const charge = await provider.charge({ stepKey, tenantId: 'acme', amount: 1250, currency: 'eur' })
 */
export function createProvider(options: ProviderOptions): Provider {
  const { pool, delayMs = 0, failureRate = 0, random = Math.random, slowCardMs = 31_000 } = options
  if (!Number.isInteger(delayMs) || delayMs < 0)
    throw new TypeError('Expected `delayMs` to be a non-negative integer.')
  if (!Number.isInteger(slowCardMs) || slowCardMs < 0)
    throw new TypeError('Expected `slowCardMs` to be a non-negative integer.')
  if (!(failureRate >= 0 && failureRate <= 1))
    throw new TypeError('Expected `failureRate` to be between 0 and 1.')

  async function record(request: ChargeRequest): Promise<Charge> {
    const status = request.amount > DECLINE_ABOVE ? 'declined' : 'succeeded'
    const inserted = await pool.query<{ charge_id: string }>(
      `INSERT INTO provider_charges (step_key, charge_id, tenant_id, amount, currency, status)
       VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (step_key) DO NOTHING RETURNING charge_id`,
      [
        request.stepKey,
        `ch_${randomUUID().replaceAll('-', '')}`,
        request.tenantId,
        request.amount,
        request.currency,
        status,
      ],
    )
    if (inserted.rows[0]) return { chargeId: inserted.rows[0].charge_id, status, created: true }
    const { rows } = await pool.query<{
      charge_id: string
      status: Charge['status']
      amount: string
      currency: string
    }>('SELECT charge_id, status, amount, currency FROM provider_charges WHERE step_key = $1', [
      request.stepKey,
    ])
    const first = rows[0]!
    if (Number(first.amount) !== request.amount || first.currency !== request.currency) {
      throw new ProviderKeyReusedError(
        `Charge key ${request.stepKey} was first used for another amount or currency.`,
      )
    }
    return { chargeId: first.charge_id, status: first.status, created: false }
  }

  return {
    async charge(request) {
      const draw = failureRate > 0 ? random() : 1
      if (delayMs > 0) await sleep(delayMs)
      if (request.card === TEST_CARDS.slow) await sleep(slowCardMs)
      if (request.card === TEST_CARDS.declined) throw new CardDeclinedError()
      if (draw < failureRate / 2)
        throw new ProviderUnavailableError('Provider unavailable; nothing was charged.')
      const charge = await record(request)
      const lost = draw < failureRate || (request.card === TEST_CARDS.processingError && charge.created)
      if (lost) throw new ProviderUnavailableError('Provider timed out after taking the charge.')
      return charge
    },
    async countCharges(filter = {}) {
      const { rows } = await pool.query<{ n: string }>(
        'SELECT count(*) AS n FROM provider_charges WHERE $1::text IS NULL OR tenant_id = $1',
        [filter.tenantId ?? null],
      )
      return Number(rows[0]!.n)
    },
  }
}
