/**
 * The end of the drain, before the ledger is read: every intent the run started has ended, and the raw ones that
 * ended without a definite answer were sent again: a probe or a failover replay while its key is still held, a
 * burst's payment and an expired changed payload always (a client retries a payment it got no answer for, as the
 * SDK's resume does for its own; and the latter must end refused, whatever the key's row says).
 * So a key still in progress afterwards (`key-in-flight`) is one that nobody could finish, not one whose request was
 * still retrying, or was abandoned, when the run ended.
 */
import type pg from 'pg'
import type { IntentTracker, TrackedIntent } from './in-flight.js'

export interface SettleOptions {
  tracker: IntentTracker
  /** The keys whose row is in progress now, as `<scope>\u0000<key>` ({@link keysInProgress}). */
  held: () => Promise<Set<string>>
  /** Sends one intent again; resolves once it was handed over (the tracker says when it ends). */
  sendAgain: (intent: TrackedIntent) => Promise<void>
  log: (line: string) => void
  /** How long each wait for the intents in flight may take. @default 120000 */
  timeoutMs?: number
  /** How often the tracker is looked at. @default 100 */
  pollMs?: number
}

/** Waits for the intents in flight, sends again what ended unanswered (see above), and waits for those. */
export async function settle(options: SettleOptions): Promise<void> {
  const { tracker, log } = options
  const timeoutMs = options.timeoutMs ?? 120_000
  const pollMs = options.pollMs ?? 100
  const drained = () => waitFor(() => tracker.inFlight().length === 0, timeoutMs, pollMs)
  await drained()
  const late = tracker.inFlight()
  if (late.length > 0) log(`still in flight after ${timeoutMs} ms: ${late.map((i) => i.id).join(', ')}`)
  const held = await options.held()
  const again = tracker
    .withoutAnswer()
    .filter(
      (intent) =>
        intent.kind === 'saturation' ||
        intent.kind === 'expired-changed-payload' ||
        held.has(`${intent.tenant}\u0000${intent.key}`),
    )
  if (again.length === 0) return
  log(`sending again what ended without an answer: ${again.map((i) => i.id).join(', ')}`)
  await Promise.all(again.map((intent) => options.sendAgain(intent)))
  await drained()
}

/** The keys whose row is in progress, as `<scope>\u0000<key>`. */
export async function keysInProgress(pool: pg.Pool): Promise<Set<string>> {
  const { rows } = await pool.query<{ scope: string; key: string }>(
    "SELECT scope, key FROM oncely.idempotency_keys WHERE status = 'in_progress'",
  )
  return new Set(rows.map((row) => `${row.scope}\u0000${row.key}`))
}

/** Polls `condition` until it holds or `timeoutMs` passed. */
export async function waitFor(condition: () => boolean, timeoutMs: number, pollMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!condition() && Date.now() < deadline) await new Promise((r) => setTimeout(r, pollMs))
}
