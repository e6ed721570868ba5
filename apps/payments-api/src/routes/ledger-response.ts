// The answer of `GET /v1/ledger`, on its own without imports, so the checkout page can share the type.

/** `GET /v1/ledger`'s answer. */
export interface Ledger {
  tenant: string
  /** The tenant's payments, newest first (at most `LEDGER_ROWS` of ledger.ts). */
  payments: {
    id: string
    amount: number
    currency: string
    chargeId: string
    idempotencyKey: string | null
  }[]
  /** The provider's charges for the tenant, newest first (at most `LEDGER_ROWS` of ledger.ts). */
  charges: { chargeId: string; amount: number; currency: string; status: 'succeeded' | 'declined' }[]
  totals: { payments: number; charges: number }
}
