// The intent record the client writes ahead of one `POST /ledger`, shared by the Node and Chromium suites (it sizes
// the floors' writes, and fills stores for the resume() timing). No Node or browser import: both bundles use it.
import type { IntentRecord } from '@oncely/client'

/** The body every client suite posts. */
export const LEDGER_BODY = { account: 'acct-42', amount: 1250 }

/** A pending intent for `POST <origin>/ledger` with a fresh random key, as the client writes it ahead. */
export function ledgerIntent(origin: string, attempts = 1): IntentRecord {
  const key = crypto.randomUUID()
  const now = Date.now()
  return {
    format: 1,
    id: key,
    key,
    method: 'POST',
    url: `${origin}/ledger`,
    body: { encoding: 'utf8', data: JSON.stringify(LEDGER_BODY) },
    headers: { 'content-type': 'application/json' },
    createdAt: now,
    expiresAt: now + 3_600_000,
    attempts,
    version: 1,
    state: 'pending',
  }
}
