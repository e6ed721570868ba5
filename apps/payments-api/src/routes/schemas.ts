/** JSON schemas of the request bodies, checked by Fastify before any idempotency key is reserved. */

/** Body of `POST /v1/payments`. */
export interface PaymentBody {
  /** Minor units, a positive integer. */
  amount: number
  /** ISO 4217 code in lowercase, such as `eur`. */
  currency: string
  /** The merchant's own label, up to 200 characters; not unique. */
  reference?: string
  /** The card to charge, 12 to 19 digits (the simulated provider's `TEST_CARDS` choose an outcome). */
  card?: string
}

export const paymentBodySchema = {
  type: 'object',
  additionalProperties: false,
  required: ['amount', 'currency'],
  properties: {
    amount: { type: 'integer', minimum: 1, maximum: Number.MAX_SAFE_INTEGER },
    currency: { type: 'string', pattern: '^[a-z]{3}$' },
    reference: { type: 'string', maxLength: 200 },
    card: { type: 'string', pattern: '^[0-9]{12,19}$' },
  },
} as const
