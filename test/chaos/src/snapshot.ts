/**
 * Reads the final ledger from the demo's database into the checker's {@link FinalDb}. Connects directly to
 * Postgres (never through the fault proxy) after everything has healed and drained. A failing run also keeps the
 * whole database as SQL ({@link dump}).
 *
 * Tables read (docs/chaos.md lists them for the demo's author): `payments`, `provider_charges`, `outbox`, and the
 * server's idempotency table (`oncely.idempotency_keys` by default, scope = tenant id).
 */
import { spawn } from 'node:child_process'
import { createWriteStream, rmSync } from 'node:fs'
import type pg from 'pg'
import type { ChargeRow, FinalDb, KeyRow, OutboxRow, PaymentRow } from './checker.js'

/** Anything with pg's `query`: a Pool, a Client. */
export interface Queryable {
  query<R extends pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>>
}

export interface SnapshotOptions {
  /** The idempotency table, schema-qualified and already quoted where needed. @default 'oncely.idempotency_keys' */
  keysTable?: string
  /** The simulated provider's database, when it has its own (`PROVIDER_DATABASE_URL`). @default db */
  providerDb?: Queryable
}

export async function readFinalDb(db: Queryable, options: SnapshotOptions = {}): Promise<FinalDb> {
  const keysTable = options.keysTable ?? 'oncely.idempotency_keys'
  const payments = await db.query<{
    id: string
    tenant_id: string
    amount: string
    currency: string
    reference: string | null
    charge_id: string | null
  }>(
    'SELECT id::text, tenant_id, amount::text, currency, reference, charge_id FROM payments ORDER BY created_at, id',
  )
  // The provider ledger has no reference of its own: a charge is attributed through the payment that recorded its
  // charge id (the first one, when idempotency is off and two payments share a charge).
  const charges = await (options.providerDb ?? db).query<{
    charge_id: string
    tenant_id: string
    amount: string
    currency: string
    status: string
  }>('SELECT charge_id, tenant_id, amount::text, currency, status FROM provider_charges ORDER BY charge_id')
  const referenceOf = new Map<string, string | null>()
  for (const row of payments.rows) {
    const charge = `${row.tenant_id}\u0000${row.charge_id}`
    if (row.charge_id !== null && !referenceOf.has(charge)) referenceOf.set(charge, row.reference)
  }
  const keys = await db.query<{
    scope: string
    key: string
    status: string
    response_status: number | null
    body: string | null
    created_ms: number
  }>(
    `SELECT scope, key, status, response_status, convert_from(response_body, 'UTF8') AS body,
      (extract(epoch FROM created_at) * 1000)::float8 AS created_ms FROM ${keysTable}`,
  )
  const outbox = await db.query<{ id: string; aggregate_id: string | null }>(
    'SELECT id::text, aggregate_id FROM outbox ORDER BY created_at, id',
  )
  return {
    payments: payments.rows.map(
      (row): PaymentRow => ({
        id: row.id,
        tenantId: row.tenant_id,
        amount: Number(row.amount),
        currency: row.currency,
        reference: row.reference,
        chargeId: row.charge_id,
      }),
    ),
    charges: charges.rows.map(
      (row): ChargeRow => ({
        id: row.charge_id,
        tenantId: row.tenant_id,
        amount: Number(row.amount),
        currency: row.currency,
        reference: referenceOf.get(`${row.tenant_id}\u0000${row.charge_id}`) ?? null,
        status: row.status,
      }),
    ),
    keys: keys.rows.map(
      (row): KeyRow => ({
        tenantId: row.scope,
        key: row.key,
        state: row.status,
        responseStatus: row.response_status,
        responseBody: parseBody(row.body),
        createdAt: row.created_ms,
      }),
    ),
    outbox: outbox.rows.map((row): OutboxRow => ({ id: row.id, paymentId: row.aggregate_id })),
  }
}

/** Stored bodies are the bytes sent; JSON ones are compared as values, anything else as text. */
function parseBody(text: string | null): unknown {
  if (text === null || text === '') return null
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}

/** Keeps a failing run's database as SQL next to its history, when the local pg_dump can read that server. */
export async function dump(url: string, file: string, log: (line: string) => void): Promise<void> {
  await new Promise<void>((resolve) => {
    const child = spawn('pg_dump', ['--no-owner', '--dbname', url], { stdio: ['ignore', 'pipe', 'pipe'] })
    let stderr = ''
    child.stderr.on('data', (chunk) => {
      stderr += chunk
    })
    child.stdout.pipe(createWriteStream(file))
    const fail = (why: string) => {
      rmSync(file, { force: true })
      log(`no dump.sql (${why.trim().split('\n')[0]}); ledger.json holds the rows the checker read`)
      resolve()
    }
    child.on('error', (error) => fail(error.message))
    child.on('exit', (code) => (code === 0 ? resolve() : fail(stderr || `pg_dump exited with ${code}`)))
  })
}
