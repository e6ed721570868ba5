import { createHash } from 'node:crypto'
import { canonicalJson } from '@oncely/protocol'

/**
 * A deterministic key for one external call of an execution: SHA-256 (hex) over the canonical JSON of
 * `[scope, operation, key, step]`. It is what `ctx.stepKey(step)` returns, exported so code outside the handler (a
 * reconciliation job, a support tool) can find the provider's record of a step.
 *
 * @example
 * const chargeKey = stepKeyFor('tenant_1', 'POST /v1/payments', 'order-17', 'charge')
 * await stripe.charges.list({ idempotency_key: chargeKey }) // what the provider did for that step
 */
export function stepKeyFor(scope: string, operation: string, key: string, step: string): string {
  return createHash('sha256')
    .update(canonicalJson([scope, operation, key, step]))
    .digest('hex')
}
