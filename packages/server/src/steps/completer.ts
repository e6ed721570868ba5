import type { ExecuteInput } from '../engine/types.js'
import { objectOptions, optionalFunction, positiveInteger, requiredFunction } from '../options/check.js'
import { type PostgresStore, resolveStore } from '../store/postgres-store.js'
import { parseRecoveryPoint, type RecoveryPoint } from './steps.js'

/** What a re-drive passes to `engine.execute` besides its handler, exactly as the record stores it. */
export type StoredRequest = Pick<
  ExecuteInput,
  'scope' | 'operation' | 'key' | 'fingerprint' | 'requestHeaders'
>

/**
 * An intent whose execution was abandoned: the record the completer found. `S` is the state type of the `steps()`
 * handler that wrote its recovery point.
 */
export interface AbandonedIntent<S = unknown> {
  scope: string
  operation: string
  key: string
  /** The fingerprint stored with the key: a re-drive must send this one, or the engine answers `mismatch`. */
  fingerprint: string
  /**
   * The stored request, ready to spread into `engine.execute({ ...intent.request, handler })`: scope, operation,
   * key, fingerprint and, when the engine stored any, the request headers.
   */
  request: StoredRequest
  /** `in_progress` with a lapsed lease (the process died), or `failed_retryable` (the attempt failed and nobody retried). */
  status: 'in_progress' | 'failed_retryable'
  /** Attempts so far. */
  attempts: number
  /** The raw recovery point, and its parsed form when it was written by `steps()` (else `null`). */
  recoveryPoint: string | null
  steps: RecoveryPoint<S> | null
  /** The request headers the engine stored (`requestHeaders`). */
  requestHeaders: Record<string, string> | null
}

/** Options of {@link createCompleter}. */
export interface CompleterOptions<S = unknown> {
  /** The store the engine uses. */
  store: PostgresStore
  /**
   * Re-drives one intent, usually by calling `engine.execute` again with the original request (rebuilt from the
   * state `steps()` saved, or from your own tables). The engine's reservation makes concurrent re-drives and a late
   * client retry safe: one runs, the others get `in_progress` or the replay.
   */
  redrive: (intent: AbandonedIntent<S>) => Promise<void>
  /**
   * How long after an attempt's lease ran out (or after a retryable failure) an intent counts as abandoned. Leave
   * the client time to retry first.
   * @default 60_000
   */
  graceMs?: number
  /** Intents re-driven per round. @default 50 */
  batchSize?: number
  /** Only intents that saved a recovery point (whose earlier attempt got past a step). @default true */
  onlyWithRecoveryPoint?: boolean
  /** Receives errors thrown by `redrive` or by the query. Must not throw. */
  onError?: (error: unknown, intent?: AbandonedIntent<S>) => void
}

/** Re-drives abandoned intents. Create with {@link createCompleter}. */
export interface Completer {
  /** Finds abandoned intents and re-drives them one by one; resolves with how many were found. */
  runOnce(): Promise<number>
  /** Runs `runOnce` every `intervalMs` (default 30 s); returns a stop function. The timer does not keep the process alive. */
  start(intervalMs?: number): () => void
}

/**
 * The completer: a background process that finishes what a crashed server started, so an intent
 * whose client gave up still completes (or compensates) instead of staying half done.
 *
 * @example
 * createCompleter<{ amount: number }>({ store, graceMs: 60_000, redrive: async (intent) => {
 *   if (!intent.steps) return // not written by steps(): nothing to resume from
 *   await engine.execute({ ...intent.request, handler: pay(intent.steps.state.amount) })
 * } }).start()
 */
export function createCompleter<S = unknown>(options: CompleterOptions<S>): Completer {
  objectOptions('createCompleter()', options)
  requiredFunction('redrive', options.redrive)
  optionalFunction('onError', options.onError)
  const graceMs = positiveInteger('graceMs', options.graceMs ?? 60_000)
  const batchSize = positiveInteger('batchSize', options.batchSize ?? 50)
  const withPoint = options.onlyWithRecoveryPoint ?? true
  const { database, names } = resolveStore(options.store)
  const report = (error: unknown, intent?: AbandonedIntent<S>) => {
    try {
      options.onError?.(error, intent)
    } catch {
      // An observer must not stop the completer.
    }
  }

  async function runOnce(): Promise<number> {
    const { rows } = await database.query<{
      scope: string
      operation: string
      key: string
      fingerprint: string
      status: 'in_progress' | 'failed_retryable'
      attempts: number
      recovery_point: string | null
      request_headers: Record<string, string> | null
    }>({
      text: `SELECT scope, operation, key, fingerprint, status, attempts, recovery_point, request_headers FROM ${names.qualified}
WHERE expires_at > now() AND ($3::boolean = false OR recovery_point IS NOT NULL) AND (
  (status = 'in_progress' AND locked_until <= now() - ($1::float8 * interval '1 millisecond'))
  OR (status = 'failed_retryable' AND updated_at <= now() - ($1::float8 * interval '1 millisecond')))
ORDER BY updated_at LIMIT $2`,
      values: [graceMs, batchSize, withPoint],
    })
    for (const row of rows) {
      const { scope, operation, key, fingerprint } = row
      const intent: AbandonedIntent<S> = {
        scope,
        operation,
        key,
        fingerprint,
        request: {
          scope,
          operation,
          key,
          fingerprint,
          ...(row.request_headers ? { requestHeaders: row.request_headers } : {}),
        },
        status: row.status,
        attempts: row.attempts,
        recoveryPoint: row.recovery_point,
        steps: parseRecoveryPoint<S>(row.recovery_point),
        requestHeaders: row.request_headers,
      }
      try {
        await options.redrive(intent)
      } catch (error) {
        report(error, intent)
      }
    }
    return rows.length
  }

  return {
    runOnce,
    start(intervalMs = 30_000) {
      positiveInteger('intervalMs', intervalMs)
      let running = false
      const timer = setInterval(() => {
        if (running) return
        running = true
        runOnce()
          .catch((error) => report(error))
          .finally(() => {
            running = false
          })
      }, intervalMs)
      timer.unref?.()
      return () => clearInterval(timer)
    },
  }
}
