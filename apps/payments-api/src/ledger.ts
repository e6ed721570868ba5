/**
 * The demo's ledger: the `payments` table, whose natural key is one payment per tenant and provider charge
 * (migration 004). Recording a payment goes through `insertOrExisting`, so a request that reaches the ledger again
 * for a charge already recorded (a retry whose idempotency key expired) gets the payment that exists.
 */
import { randomUUID } from 'node:crypto'
import { insertOrExisting } from '@oncely/server'
import type pg from 'pg'

/** A payment as the API returns it. */
export interface Payment {
  id: string
  amount: number
  currency: string
  reference: string | null
  status: 'succeeded'
  chargeId: string
}

/** The unique constraint of the ledger's natural key, `(tenant_id, charge_id)`. */
export const PAYMENT_PER_CHARGE = 'payments_tenant_charge_key'

interface PaymentRow {
  id: string
  amount: string
  currency: string
  reference: string | null
  charge_id: string
}

const COLUMNS = 'id, amount, currency, reference, charge_id'

/** A `payments` row as the API shows it. */
export function toPayment(row: PaymentRow): Payment {
  return {
    id: row.id,
    amount: Number(row.amount),
    currency: row.currency,
    reference: row.reference,
    status: 'succeeded',
    chargeId: row.charge_id,
  }
}

/** What {@link recordPayment} writes. */
export interface NewPayment {
  tenantId: string
  amount: number
  currency: string
  reference: string | null
  chargeId: string
  /** The request's idempotency key, kept for support (not unique: keys expire and come back). */
  idempotencyKey: string | null
}

/**
 * Records the payment of a charge on `tx`, or finds the one already recorded for it: `created` tells which.
 *
 * @example
 * const { created, payment } = await recordPayment(tx, { tenantId, amount: 1250, currency: 'eur', reference: null, chargeId, idempotencyKey })
 */
export async function recordPayment(
  tx: pg.PoolClient,
  payment: NewPayment,
): Promise<{ created: boolean; payment: Payment }> {
  const { created, value } = await insertOrExisting(tx, {
    constraint: PAYMENT_PER_CHARGE,
    insert: (c) =>
      c
        .query<PaymentRow>(
          `INSERT INTO payments (id, tenant_id, amount, currency, reference, charge_id, idempotency_key)
           VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING ${COLUMNS}`,
          [
            randomUUID(),
            payment.tenantId,
            payment.amount,
            payment.currency,
            payment.reference,
            payment.chargeId,
            payment.idempotencyKey,
          ],
        )
        .then((r) => r.rows[0]!),
    existing: (c) =>
      c
        .query<PaymentRow>(`SELECT ${COLUMNS} FROM payments WHERE tenant_id = $1 AND charge_id = $2`, [
          payment.tenantId,
          payment.chargeId,
        ])
        .then((r) => r.rows[0]!),
  })
  return { created, payment: toPayment(value) }
}

/** The tenant's payment `id`, or undefined (another tenant's payment is not found either). */
export async function findPayment(pool: pg.Pool, tenantId: string, id: string): Promise<Payment | undefined> {
  const { rows } = await pool.query<PaymentRow>(
    `SELECT ${COLUMNS} FROM payments WHERE id = $1 AND tenant_id = $2`,
    [id, tenantId],
  )
  return rows[0] ? toPayment(rows[0]) : undefined
}
