import { createHash, randomUUID } from 'node:crypto'
import { canonicalJson } from '@oncely/protocol'
import type { Redis } from 'ioredis'
import { positiveInteger } from '../engine/options.js'
import type { Engine, ExecuteInput, Outcome } from '../engine/types.js'
import { boundedWait } from '../engine/wait.js'

/** Options of {@link withSoftLease}. */
export interface SoftLeaseOptions {
  /** An ioredis client. Prefer `enableOfflineQueue: false` so commands fail fast while Redis is down. */
  redis: Redis
  /**
   * Lease lifetime. Set it above the handler's p99 (like the engine's `leaseMs`); a lease that runs out early only
   * costs database round trips, never correctness.
   * @default the engine's leaseMs
   */
  ttlMs?: number
  /** Prefix of the lease keys. @default 'oncely:lease:' */
  prefix?: string
  /**
   * When Redis fails or times out: `'fall-through'` goes straight to Postgres (which stays correct, only slower);
   * `'fail-closed'` answers `unavailable`, for operations that must not load the database while Redis is down.
   * @default 'fall-through'
   */
  onRedisError?: 'fall-through' | 'fail-closed'
  /** A Redis call slower than this counts as a failure (and falls through or fails closed). @default 250 */
  timeoutMs?: number
  /** `retryAfterMs` advised when failing closed. @default 1_000 */
  unavailableRetryAfterMs?: number
  /** Receives Redis failures (the request continues per `onRedisError`). Must not throw. */
  onError?: (error: unknown) => void
}

// One round trip: take the lease, or report who holds it and for how long.
const ACQUIRE = `if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}`
// Delete only our own lease: a lease that ran out and was taken by another request must stay.
const RELEASE = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`Redis did not answer within ${ms} ms.`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

/**
 * Puts a Redis soft lease in front of an engine (seed 000, layer 2): the first request for a key takes
 * `SET NX PX` with a random token, and duplicates arriving while it runs get `in_progress` (with the lease's
 * remaining time as `retryAfterMs`) without touching Postgres. A duplicate with another fingerprint goes on to
 * Postgres, which answers `mismatch` (so "422 before 409" holds). The lease is never authoritative: the engine's
 * reservation still decides, so a lost, expired or evicted lease costs one database round trip, not a duplicate.
 *
 * @example
 * const engine = withSoftLease(createEngine({ store }), { redis: new Redis({ enableOfflineQueue: false }) })
 */
export function withSoftLease(engine: Engine, options: SoftLeaseOptions): Engine {
  if (typeof engine?.execute !== 'function') throw new TypeError('Expected `engine` to be an Engine.')
  if (typeof options !== 'object' || options === null)
    throw new TypeError('Expected `options` to be an object.')
  const { redis } = options
  if (typeof redis?.eval !== 'function') throw new TypeError('Expected `redis` to be an ioredis client.')
  const ttlMs = positiveInteger('ttlMs', options.ttlMs ?? engine.options.leaseMs)
  const timeoutMs = positiveInteger('timeoutMs', options.timeoutMs ?? 250)
  const retryAfterMs = positiveInteger('unavailableRetryAfterMs', options.unavailableRetryAfterMs ?? 1_000)
  const prefix = options.prefix ?? 'oncely:lease:'
  if (typeof prefix !== 'string') throw new TypeError('Expected `prefix` to be a string.')
  const onRedisError = options.onRedisError ?? 'fall-through'
  if (onRedisError !== 'fall-through' && onRedisError !== 'fail-closed') {
    throw new TypeError("Expected `onRedisError` to be 'fall-through' or 'fail-closed'.")
  }
  const report = (error: unknown) => {
    try {
      options.onError?.(error)
    } catch {
      // An observer must not change the outcome.
    }
  }
  const leaseKey = (input: ExecuteInput) =>
    prefix +
    createHash('sha256')
      .update(canonicalJson([input.scope, input.operation, input.key]))
      .digest('hex')

  type Acquired = { acquired: true } | { acquired: false; fingerprint: string | undefined; pttl: number }
  async function acquire(key: string, value: string): Promise<Acquired> {
    const reply = (await withTimeout(redis.eval(ACQUIRE, 1, key, value, ttlMs), timeoutMs)) as [
      number,
      string | null,
      number,
    ]
    if (reply[0] === 1) return { acquired: true }
    let fingerprint: string | undefined
    try {
      fingerprint = (JSON.parse(reply[1] ?? 'null') as { f?: string } | null)?.f
    } catch {
      fingerprint = undefined // a foreign value under our prefix: let Postgres decide
    }
    return { acquired: false, fingerprint, pttl: reply[2] }
  }

  async function execute(input: ExecuteInput): Promise<Outcome> {
    const key = leaseKey(input)
    const token = randomUUID()
    const value = JSON.stringify({ t: token, f: input.fingerprint })
    const waited = boundedWait(input.wait?.timeoutMs)
    for (;;) {
      let state: Acquired
      try {
        state = await acquire(key, value)
      } catch (error) {
        report(error)
        if (onRedisError === 'fail-closed') return { kind: 'unavailable', retryAfterMs, error }
        return engine.execute(input)
      }
      if (state.acquired) {
        try {
          return await engine.execute(input)
        } finally {
          await withTimeout(redis.eval(RELEASE, 1, key, value), timeoutMs).catch(report)
        }
      }
      // Another fingerprint, or a lease about to lapse: Postgres gives the authoritative answer.
      if (state.fingerprint !== input.fingerprint || state.pttl <= 0) return engine.execute(input)
      if (await waited()) continue
      if (input.wait) return engine.execute({ ...input, wait: undefined })
      return { kind: 'in_progress', retryAfterMs: state.pttl, fencedOut: false }
    }
  }

  return { ...engine, execute }
}
