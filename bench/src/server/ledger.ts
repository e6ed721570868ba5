// The business transaction every variant wraps: one INSERT into a ledger table inside a transaction. The
// idempotency key is recorded on the row (without a constraint) so the storm suite can count executions per key.
import type pg from 'pg'

export const LEDGER_SCHEMA = `CREATE TABLE IF NOT EXISTS ledger (
  id          bigserial   PRIMARY KEY,
  request_key text,
  account     text        NOT NULL,
  amount      integer     NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ledger_request_key ON ledger (request_key)`

/** The request body every variant accepts. */
export interface Transfer {
  account: string
  amount: number
}

/** What every variant answers on a first execution: 201 and the new row. */
export interface LedgerResponse {
  status: 201
  body: { id: string; account: string; amount: number }
}

const INSERT = 'INSERT INTO ledger (request_key, account, amount) VALUES ($1, $2, $3) RETURNING id'

/** The INSERT alone, on a client that is already inside a transaction (oncely owns BEGIN and COMMIT). */
export async function insertEntry(
  tx: pg.ClientBase,
  key: string | undefined,
  transfer: Transfer,
): Promise<LedgerResponse> {
  const { rows } = await tx.query<{ id: string }>(INSERT, [key ?? null, transfer.account, transfer.amount])
  return { status: 201, body: { id: rows[0]!.id, account: transfer.account, amount: transfer.amount } }
}

/** The whole business transaction as a service without an idempotency layer runs it: BEGIN, INSERT, COMMIT. */
export async function recordTransfer(
  pool: pg.Pool,
  key: string | undefined,
  transfer: Transfer,
): Promise<LedgerResponse> {
  const client = await pool.connect()
  try {
    await client.query('BEGIN')
    const response = await insertEntry(client, key, transfer)
    await client.query('COMMIT')
    return response
  } catch (error) {
    await client.query('ROLLBACK').catch(() => {})
    throw error
  } finally {
    client.release()
  }
}

/** Reads the key header as Fastify parsed it (a repeated header is not a key). */
export function headerKey(value: string | string[] | undefined): string | undefined {
  return typeof value === 'string' ? value : undefined
}
