/**
 * `GET /v1/ledger`: what the caller's tenant has been charged, read-only, for the checkout page's ledger panel. It
 * shows the two tables a duplicate would show up in: the API's `payments` rows and the simulated provider's charges
 * (the provider's own ledger, which a retry that reached the provider with a new key would grow).
 */
import type { FastifyInstance } from 'fastify'
import type pg from 'pg'
import type { Ledger } from './ledger-response.js'

export type { Ledger } from './ledger-response.js'

/** How many of the newest rows of each table the ledger lists; the totals count every row. */
export const LEDGER_ROWS = 50

/** Registers `GET /v1/ledger` (authenticated like every `/v1/` route: it answers for the caller's tenant only). */
export function registerLedgerRoute(app: FastifyInstance, pool: pg.Pool): void {
  app.get('/v1/ledger', async (request, reply): Promise<Ledger> => {
    const tenant = request.tenant
    // One snapshot for both tables, so the panel never shows a payment without the charge it committed after.
    const client = await pool.connect()
    try {
      await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY')
      const payments = await client.query<{
        id: string
        amount: string
        currency: string
        charge_id: string
        idempotency_key: string | null
        total: string
      }>(
        `SELECT id, amount, currency, charge_id, idempotency_key, count(*) OVER () AS total
         FROM payments WHERE tenant_id = $1 ORDER BY created_at DESC, id LIMIT $2`,
        [tenant, LEDGER_ROWS],
      )
      const charges = await client.query<{
        charge_id: string
        amount: string
        currency: string
        status: 'succeeded' | 'declined'
        total: string
      }>(
        `SELECT charge_id, amount, currency, status, count(*) OVER () AS total
         FROM provider_charges WHERE tenant_id = $1 ORDER BY created_at DESC, charge_id LIMIT $2`,
        [tenant, LEDGER_ROWS],
      )
      await client.query('COMMIT')
      reply.header('cache-control', 'no-store')
      return {
        tenant,
        payments: payments.rows.map((row) => ({
          id: row.id,
          amount: Number(row.amount),
          currency: row.currency,
          chargeId: row.charge_id,
          idempotencyKey: row.idempotency_key,
        })),
        charges: charges.rows.map((row) => ({
          chargeId: row.charge_id,
          amount: Number(row.amount),
          currency: row.currency,
          status: row.status,
        })),
        totals: {
          payments: Number(payments.rows[0]?.total ?? 0),
          charges: Number(charges.rows[0]?.total ?? 0),
        },
      }
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {})
      throw error
    } finally {
      client.release()
    }
  })
}
