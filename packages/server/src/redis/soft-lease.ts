import { createHash, randomUUID } from 'node:crypto'
import { canonicalJson } from '@oncely/protocol'
import type { Redis } from 'ioredis'
import type { Engine, ExecuteInput, Outcome } from '../engine/types.js'
import { boundedWait } from '../engine/wait.js'
import { RedisTimeoutError } from '../errors/redis-timeout-error.js'
import { wrapEngine } from '../hooks.js'
import {
  engineOption,
  hasMethods,
  objectOptions,
  oneOf,
  optionalFunction,
  positiveInteger,
} from '../options/check.js'

/** Options of {@link withSoftLease}. */
export interface SoftLeaseOptions {
  /**
   * An ioredis client. Prefer `enableOfflineQueue: false` so commands fail fast while Redis is down. The soft lease
   * waits (up to `timeoutMs`) for a client that is still connecting, connects one created with `lazyConnect`, and
   * adds an `'error'` listener that reports through `onError` (so ioredis never prints unhandled error events).
   */
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
  /**
   * After a Redis failure, how long to leave Redis alone (answering as `onRedisError` says without calling it), so a
   * Redis that is down or unreachable costs one timeout per period instead of one per request. Then one request
   * tries Redis again.
   * @default 5_000
   */
  breakerMs?: number
  /** `retryAfterMs` advised when failing closed. @default 1_000 */
  unavailableRetryAfterMs?: number
  /** Receives Redis failures (the request continues per `onRedisError`), once per failure period. Must not throw. */
  onError?: (error: unknown) => void
}

// One round trip: take the lease, or report who holds it and for how long.
const ACQUIRE = `if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}`
// Delete only our own lease: a lease that ran out and was taken by another request must stay.
const RELEASE = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`

// A live holder reserves the key in Postgres within its first milliseconds: a younger lease whose key Postgres says
// is free is trusted (its holder is about to reserve), an older one is stale (its holder died before committing).
const STALE_LEASE_AGE_MS = 1_000

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new RedisTimeoutError(ms)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

type Acquired = { acquired: true } | { acquired: false; fingerprint: string | undefined; pttl: number }

/** The options of {@link withSoftLease}, checked, with their defaults. */
interface Settings {
  redis: Redis
  ttlMs: number
  timeoutMs: number
  breakerMs: number
  retryAfterMs: number
  prefix: string
  onRedisError: 'fall-through' | 'fail-closed'
}

function checkSettings(engine: Engine, options: SoftLeaseOptions): Settings {
  engineOption('engine', engine)
  objectOptions('withSoftLease()', options)
  const { redis } = options
  hasMethods('redis', redis, ['eval'], 'an ioredis client')
  const ttlMs = positiveInteger('ttlMs', options.ttlMs ?? engine.options.leaseMs)
  const timeoutMs = positiveInteger('timeoutMs', options.timeoutMs ?? 250)
  const breakerMs = positiveInteger('breakerMs', options.breakerMs ?? 5_000)
  const retryAfterMs = positiveInteger('unavailableRetryAfterMs', options.unavailableRetryAfterMs ?? 1_000)
  const prefix = options.prefix ?? 'oncely:lease:'
  if (typeof prefix !== 'string') throw new TypeError('Expected `prefix` to be a string.')
  const onRedisError = oneOf('onRedisError', options.onRedisError ?? 'fall-through', [
    'fall-through',
    'fail-closed',
  ])
  optionalFunction('onError', options.onError)
  return { redis, ttlMs, timeoutMs, breakerMs, retryAfterMs, prefix, onRedisError }
}

/** The circuit breaker: after a failure Redis is left alone until `openUntil`; then one request probes it. */
class Breaker {
  #openUntil = 0
  #probing = false
  readonly #periodMs: number
  readonly #report: (error: unknown) => void

  constructor(periodMs: number, report: (error: unknown) => void) {
    this.#periodMs = periodMs
    this.#report = report
  }

  /** Opens the breaker for a period from now (a listener of its own, so that it may be handed to `redis.on`). */
  readonly fail = (error: unknown): void => {
    if (Date.now() >= this.#openUntil) this.#report(error) // once per failure period, not once per request
    this.#openUntil = Date.now() + this.#periodMs
  }

  /** Runs a Redis call through the breaker; undefined when Redis is left alone or failed. */
  async call<T>(run: () => Promise<T>): Promise<T | undefined> {
    if (!this.#admits()) return undefined
    try {
      const result = await run()
      this.#openUntil = 0
      return result
    } catch (error) {
      this.fail(error)
      return undefined
    } finally {
      this.#probing = false
    }
  }

  /** Whether a call may go to Redis: always while closed, never while open, then one (the probe) at a time. */
  #admits(): boolean {
    if (Date.now() < this.#openUntil) return false
    if (this.#openUntil !== 0) {
      if (this.#probing) return false
      this.#probing = true
    }
    return true
  }
}

/** The lease keys in Redis: every call waits for a ready client, is timed out and goes through the breaker. */
class Leases {
  readonly #redis: Redis
  readonly #ttlMs: number
  readonly #timeoutMs: number
  readonly #breaker: Breaker
  /** Resolves when the client is ready, or rejects after `timeoutMs` (shared by every request that waits). */
  #ready: Promise<void> | undefined

  constructor(redis: Redis, ttlMs: number, timeoutMs: number, breaker: Breaker) {
    this.#redis = redis
    this.#ttlMs = ttlMs
    this.#timeoutMs = timeoutMs
    this.#breaker = breaker
  }

  /** Takes the lease on `key`, or says who holds it and for how long; undefined when Redis is unavailable. */
  async acquire(key: string, value: string): Promise<Acquired | undefined> {
    const reply = (await this.#call(() => this.#redis.eval(ACQUIRE, 1, key, value, this.#ttlMs))) as
      | [number, string | null, number]
      | undefined
    if (!reply) return undefined
    if (reply[0] === 1) return { acquired: true }
    let fingerprint: string | undefined
    try {
      fingerprint = (JSON.parse(reply[1] ?? 'null') as { f?: string } | null)?.f
    } catch {
      fingerprint = undefined // a foreign value under our prefix: let Postgres decide
    }
    return { acquired: false, fingerprint, pttl: reply[2] }
  }

  /** Lets go of the lease `acquire` took with `value`. */
  async release(key: string, value: string): Promise<void> {
    await this.#call(() => this.#redis.eval(RELEASE, 1, key, value))
  }

  #call<T>(run: () => Promise<T>): Promise<T | undefined> {
    return this.#breaker.call(async () => {
      await this.#whenReady()
      return await withTimeout(run(), this.#timeoutMs)
    })
  }

  #whenReady(): Promise<void> {
    const redis = this.#redis
    if (redis.status === 'ready') return Promise.resolve()
    if (redis.status === 'wait') redis.connect().catch(this.#breaker.fail) // created with lazyConnect
    this.#ready ??= withTimeout(
      new Promise<void>((resolve, reject) => {
        const onReady = () => {
          redis.off('end', onEnd)
          resolve()
        }
        const onEnd = () => {
          redis.off('ready', onReady)
          reject(new Error('The Redis connection ended.'))
        }
        redis.once('ready', onReady)
        redis.once('end', onEnd)
      }),
      this.#timeoutMs,
    ).finally(() => {
      this.#ready = undefined
    })
    return this.#ready
  }
}

const leaseKey = (prefix: string, input: ExecuteInput) =>
  prefix +
  createHash('sha256')
    .update(canonicalJson([input.scope, input.operation, input.key]))
    .digest('hex')

/**
 * Puts a Redis soft lease in front of an engine: the first request for a key takes `SET NX PX` with a random
 * token, and duplicates arriving while it runs get `in_progress` (with the lease's remaining time as
 * `retryAfterMs`) without reserving anything in Postgres. A duplicate with another fingerprint goes on to Postgres,
 * which answers `mismatch`. The lease is never authoritative: before answering `in_progress` the record is checked
 * (`engine.peek`, answered from the replay cache when this process finished the key), so a lease left behind by a
 * process that died after its commit still replays at once, and one left by a process that died before it is
 * taken over by Postgres's reservation. A lost, expired or evicted lease costs a database round trip, never a
 * duplicate.
 *
 * @example
 * const redis = new Redis(process.env.REDIS_URL, { enableOfflineQueue: false })
 * const engine = withSoftLease(createEngine({ store }), { redis, onError: (e) => log.warn(e) })
 */
export function withSoftLease(engine: Engine, options: SoftLeaseOptions): Engine {
  const { redis, ttlMs, timeoutMs, breakerMs, retryAfterMs, prefix, onRedisError } = checkSettings(
    engine,
    options,
  )
  const report = (error: unknown) => {
    try {
      options.onError?.(error)
    } catch {
      // An observer must not change the outcome.
    }
  }
  const breaker = new Breaker(breakerMs, report)
  // Connection errors arrive as events too: they open the breaker (without a listener ioredis would print them).
  redis.on('error', breaker.fail)
  const leases = new Leases(redis, ttlMs, timeoutMs, breaker)

  /** Runs the engine while holding the lease, then lets go of it. */
  async function executeHolding(input: ExecuteInput, key: string, value: string): Promise<Outcome> {
    try {
      return await engine.execute(input)
    } finally {
      await leases.release(key, value)
    }
  }

  async function execute(input: ExecuteInput): Promise<Outcome> {
    const key = leaseKey(prefix, input)
    const value = JSON.stringify({ t: randomUUID(), f: input.fingerprint })
    const waited = boundedWait(input.wait?.timeoutMs)
    for (;;) {
      const state = await leases.acquire(key, value)
      if (!state) {
        if (onRedisError === 'fail-closed')
          return { kind: 'unavailable', retryAfterMs, error: new Error('Redis is unavailable.') }
        return engine.execute(input)
      }
      if (state.acquired) return executeHolding(input, key, value)
      // Another fingerprint, or a lease about to lapse: Postgres gives the authoritative answer.
      if (state.fingerprint !== input.fingerprint || state.pttl <= 0) return engine.execute(input)
      if (await waited()) continue
      return answerBusy(engine, input, state.pttl, ttlMs)
    }
  }

  return wrapEngine(engine, { execute })
}

/** The answer to a duplicate the lease says is busy, once it waited as long as it may. */
async function answerBusy(
  engine: Engine,
  input: ExecuteInput,
  pttl: number,
  ttlMs: number,
): Promise<Outcome> {
  // The lease says busy; the record may know better (finished, or nobody holds the key any more).
  const recorded = await engine.peek(input)
  if (recorded === null) {
    if (ttlMs - pttl >= STALE_LEASE_AGE_MS) return engine.execute({ ...input, wait: undefined })
  } else if (recorded.kind !== 'in_progress' && recorded.kind !== 'unavailable') return recorded
  if (input.wait) return engine.execute({ ...input, wait: undefined })
  return { kind: 'in_progress', retryAfterMs: pttl }
}
