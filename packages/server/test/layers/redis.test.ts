import { createHash } from 'node:crypto'
import net from 'node:net'
import { canonicalJson } from '@oncely/protocol'
import type { TestDatabase } from '@oncely/test-support'
import { optionalService } from '@oncely/test-support'
import { Redis } from 'ioredis'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Engine, ExecuteInput } from '../../src/index.js'
import { isRedisTimeoutError, type RedisTimeoutError, withSoftLease } from '../../src/redis/index.js'
import {
  countPayments,
  engineFor,
  fingerprintOf,
  freshKey,
  gate,
  reservation,
  running,
  setupDatabase,
  sleep,
} from '../helpers.js'

const service = await optionalService('REDIS_URL', 'redis://127.0.0.1:6379')
if (service.skip) console.warn(`skipping Redis soft-lease tests: ${service.skip}`)

/** Counts calls that reach the Postgres engine. */
function counting(engine: Engine) {
  const counter = { calls: 0 }
  return {
    counter,
    engine: {
      ...engine,
      execute: (input: ExecuteInput) => {
        counter.calls++
        return engine.execute(input)
      },
    },
  }
}

/** The Redis key of a request's lease (as the soft lease names it), to plant a stale one. */
const leaseKeyOf = (prefix: string, input: ExecuteInput) =>
  prefix +
  createHash('sha256')
    .update(canonicalJson([input.scope, input.operation, input.key]))
    .digest('hex')

/** A loopback server that accepts connections and never answers: a Redis that is reachable but hung. */
async function blackHole() {
  let bytes = 0
  const sockets = new Set<net.Socket>()
  const server = net.createServer((socket) => {
    sockets.add(socket)
    socket.on('data', (chunk) => {
      bytes += chunk.length
    })
    socket.on('error', () => {})
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as net.AddressInfo).port,
    received: () => bytes,
    close() {
      for (const socket of sockets) socket.destroy()
      server.close()
    },
  }
}

/** A loopback TCP proxy to Redis that the test can cut, standing in for "Redis stopped". */
async function redisProxy(target: URL) {
  const sockets = new Set<net.Socket>()
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port || 6379), target.hostname)
    for (const s of [client, upstream]) {
      sockets.add(s)
      s.on('error', () => {})
      s.on('close', () => sockets.delete(s))
    }
    client.pipe(upstream).pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as net.AddressInfo).port,
    cut() {
      server.close()
      for (const s of sockets) s.destroy()
    },
  }
}

describe.skipIf(service.skip)('Redis soft lease', () => {
  let db: TestDatabase
  let redis: Redis
  beforeAll(async () => {
    db = await setupDatabase('redis')
    redis = new Redis(service.url, { enableOfflineQueue: false, maxRetriesPerRequest: 0, lazyConnect: true })
    await redis.connect()
  })
  afterAll(async () => {
    redis?.disconnect()
    await db?.drop()
  })

  const pay = (tenant: string, key: string, amount = 100, delayMs = 0): ExecuteInput => ({
    scope: tenant,
    operation: 'POST /v1/payments',
    key,
    fingerprint: fingerprintOf({ amount }),
    handler: async ({ tx }) => {
      await sleep(delayMs)
      await tx.query('INSERT INTO payments (tenant, cart, amount) VALUES ($1, $2, $3)', [tenant, key, amount])
      return { status: 201, body: { key } }
    },
  })

  /** {@link pay}, whose handler holds the key (in its transaction) until `opened` resolves, then pays. */
  const payOnceOpen = (tenant: string, key: string, opened: Promise<void>): ExecuteInput => ({
    ...pay(tenant, key, 100),
    handler: async (ctx) => {
      await opened
      return pay(tenant, key, 100).handler(ctx)
    },
  })

  /** Starts `input` through `leased`; `started` resolves once its handler runs (it holds the lease and the key). */
  const runningOnce = (leased: Engine, input: ExecuteInput) => {
    const first = running(input.handler)
    return { outcome: leased.execute({ ...input, handler: first.handler }), started: first.started }
  }

  it('answers 49 concurrent duplicates of a running request from Redis: one reservation attempt in all', async () => {
    const { engine: inner } = engineFor(db.pool)
    const { counter, engine } = counting(inner)
    const prefix = `${freshKey('t')}:`
    const errors: unknown[] = []
    // A generous timeout: on a loaded CI machine a slow answer would fall through and blur the count.
    const leased = withSoftLease(engine, { redis, prefix, timeoutMs: 5_000, onError: (e) => errors.push(e) })
    const tenant = freshKey('tenant')
    const key = freshKey()
    // The first request holds its key until every duplicate has answered: one that finished first would (rightly)
    // let a later duplicate's check of the record replay it, and the count of in_progress answers would depend on
    // how fast a loaded machine runs 49 round trips.
    const answered = gate()
    const first = runningOnce(leased, payOnceOpen(tenant, key, answered.opened))
    await first.started
    // The duplicates would pay at once: one that ran would show as a second payment and a second attempt.
    const duplicates = await Promise.all(
      Array.from({ length: 49 }, () => leased.execute(pay(tenant, key, 100))),
    )
    answered.open()
    const outcome = await first.outcome
    expect(errors).toEqual([])
    expect(outcome.kind).toBe('executed')
    expect(duplicates.map((o) => o.kind)).toEqual(Array(49).fill('in_progress'))
    expect(counter.calls, 'database reservation attempts').toBe(1)
    expect(duplicates.every((o) => o.kind === 'in_progress' && o.retryAfterMs > 0)).toBe(true)
    expect(await countPayments(db.pool, tenant)).toBe(1)
    // Released after completion, by compare-and-delete: the retry goes to Postgres and gets the replay.
    expect(await redis.keys(`${prefix}*`)).toEqual([])
    const retry = await leased.execute(pay(tenant, key))
    expect(retry.kind).toBe('replayed')
  })

  it('sends a duplicate with another fingerprint to Postgres, which answers mismatch before in_progress', async () => {
    const { engine } = engineFor(db.pool)
    const leased = withSoftLease(engine, { redis, prefix: `${freshKey('t')}:` })
    const tenant = freshKey('tenant')
    const key = freshKey()
    // The first holds its key until the other answered: finished first, it would be answered mismatch under both.
    const answered = gate()
    const first = runningOnce(leased, payOnceOpen(tenant, key, answered.opened))
    await first.started
    const other = await leased.execute(pay(tenant, key, 999))
    answered.open()
    // The row protocol's committed in_progress row carries the first fingerprint; the lock protocol has nothing
    // committed yet and answers 409, which a client retries into the mismatch.
    expect(other.kind).toBe(reservation === 'row' ? 'mismatch' : 'in_progress')
    expect((await first.outcome).kind).toBe('executed')
  })

  it('waits on the lease when asked, then returns the replay', async () => {
    const { engine } = engineFor(db.pool)
    const leased = withSoftLease(engine, { redis, prefix: `${freshKey('t')}:` })
    const tenant = freshKey('tenant')
    const key = freshKey()
    const first = runningOnce(leased, pay(tenant, key, 100, 200))
    await first.started
    const waited = await leased.execute({ ...pay(tenant, key), wait: { timeoutMs: 5_000 } })
    expect((await first.outcome).kind).toBe('executed')
    expect(waited.kind).toBe('replayed')
  })

  it('with Redis stopped mid-run nothing is duplicated (fall-through), and fail-closed touches no database', async () => {
    const proxy = await redisProxy(new URL(service.url))
    const viaProxy = new Redis({
      port: proxy.port,
      host: '127.0.0.1',
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      lazyConnect: true,
      retryStrategy: () => null,
    })
    viaProxy.on('error', () => {})
    await viaProxy.connect()
    const errors: unknown[] = []
    const { engine: inner } = engineFor(db.pool)
    const { counter, engine } = counting(inner)
    const leased = withSoftLease(engine, {
      redis: viaProxy,
      prefix: `${freshKey('t')}:`,
      onError: (e) => errors.push(e),
    })
    const tenant = freshKey('tenant')
    const keys = Array.from({ length: 10 }, () => freshKey())
    const wave = () =>
      Promise.all(
        keys.flatMap((key) => Array.from({ length: 5 }, () => leased.execute(pay(tenant, key, 100, 150)))),
      )
    const running = wave()
    await sleep(50)
    proxy.cut() // Redis "stops" while leases are held and requests are in flight
    const during = await Promise.all([running, wave()])
    await sleep(200)
    const after = await wave()
    expect(errors.length).toBeGreaterThan(0)
    expect(await countPayments(db.pool, tenant)).toBe(keys.length)
    const all = [...during.flat(), ...after]
    expect(all.filter((o) => o.kind === 'executed')).toHaveLength(keys.length)
    expect(all.every((o) => ['executed', 'replayed', 'in_progress'].includes(o.kind))).toBe(true)

    const closed = withSoftLease(engine, { redis: viaProxy, onRedisError: 'fail-closed' })
    const before = counter.calls
    expect((await closed.execute(pay(tenant, freshKey()))).kind).toBe('unavailable')
    expect(counter.calls).toBe(before)
    viaProxy.disconnect()
  })

  it('serves duplicates from a client still connecting (no lazyConnect, offline queue off): one reservation', async () => {
    const fresh = new Redis(service.url, { enableOfflineQueue: false, maxRetriesPerRequest: 0 })
    const errors: unknown[] = []
    try {
      const { engine: inner } = engineFor(db.pool)
      const { counter, engine } = counting(inner)
      const leased = withSoftLease(engine, {
        redis: fresh,
        prefix: `${freshKey('t')}:`,
        timeoutMs: 5_000,
        onError: (e) => errors.push(e),
      })
      const tenant = freshKey('tenant')
      const key = freshKey()
      const outcomes = await Promise.all(
        Array.from({ length: 20 }, () => leased.execute(pay(tenant, key, 100, 200))),
      )
      expect(errors).toEqual([])
      expect(
        outcomes.filter((o) => o.kind === 'executed'),
        JSON.stringify(outcomes),
      ).toHaveLength(1)
      expect(counter.calls).toBe(1)
      expect(await countPayments(db.pool, tenant)).toBe(1)
    } finally {
      fresh.disconnect()
    }
  })

  it('connects a client created with lazyConnect that nobody connected', async () => {
    const lazy = new Redis(service.url, { enableOfflineQueue: false, lazyConnect: true })
    try {
      const { engine: inner } = engineFor(db.pool)
      const { counter, engine } = counting(inner)
      const leased = withSoftLease(engine, { redis: lazy, prefix: `${freshKey('t')}:`, timeoutMs: 5_000 })
      const tenant = freshKey('tenant')
      const key = freshKey()
      await Promise.all(Array.from({ length: 10 }, () => leased.execute(pay(tenant, key, 100, 200))))
      expect(lazy.status).toBe('ready')
      expect(counter.calls).toBe(1)
    } finally {
      lazy.disconnect()
    }
  })

  it('leaves a hung Redis alone once it timed out (circuit breaker): one timeout and one report per period', async () => {
    const hole = await blackHole()
    const hung = new Redis({
      port: hole.port,
      host: '127.0.0.1',
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
    })
    try {
      const errors: unknown[] = []
      const { engine: inner } = engineFor(db.pool)
      const { counter, engine } = counting(inner)
      const leased = withSoftLease(engine, {
        redis: hung,
        timeoutMs: 100,
        breakerMs: 60_000,
        onError: (e) => errors.push(e),
      })
      const tenant = freshKey('tenant')
      expect((await leased.execute(pay(tenant, freshKey()))).kind).toBe('executed') // pays the timeout, falls through
      const sentAfterFirst = hole.received()
      const outcomes = await Promise.all(
        Array.from({ length: 20 }, () => leased.execute(pay(tenant, freshKey()))),
      )
      expect(outcomes.every((o) => o.kind === 'executed')).toBe(true)
      expect(counter.calls).toBe(21)
      // Nothing more was sent to the hung Redis, and the failure was reported once.
      expect(hole.received()).toBe(sentAfterFirst)
      expect(errors).toHaveLength(1)
      expect(isRedisTimeoutError(errors[0]), String(errors[0])).toBe(true)
      expect((errors[0] as RedisTimeoutError).timeoutMs).toBe(100)
      const closed = withSoftLease(engine, {
        redis: hung,
        timeoutMs: 100,
        breakerMs: 60_000,
        onRedisError: 'fail-closed',
      })
      expect((await closed.execute(pay(tenant, freshKey()))).kind).toBe('unavailable')
    } finally {
      hung.disconnect()
      hole.close()
    }
  })

  it('replays a finished key at once even when a lease from a process that died after its commit remains', async () => {
    const { engine } = engineFor(db.pool)
    const prefix = `${freshKey('t')}:`
    const leased = withSoftLease(engine, { redis, prefix })
    const request = pay(freshKey('tenant'), freshKey())
    expect((await engine.execute(request)).kind).toBe('executed')
    // The dead holder's lease: its value names the same request, and it has most of its lifetime left.
    await redis.set(
      leaseKeyOf(prefix, request),
      JSON.stringify({ t: 'dead', f: request.fingerprint }),
      'PX',
      30_000,
    )
    expect(await leased.execute(request)).toMatchObject({ kind: 'replayed' })
  })

  it('takes over from a stale lease whose holder died before its commit, and trusts a young one', async () => {
    const { engine: inner } = engineFor(db.pool)
    const { counter, engine } = counting(inner)
    const prefix = `${freshKey('t')}:`
    const ttlMs = 30_000
    const leased = withSoftLease(engine, { redis, prefix, ttlMs })
    const young = pay(freshKey('tenant'), freshKey())
    await redis.set(
      leaseKeyOf(prefix, young),
      JSON.stringify({ t: 'live', f: young.fingerprint }),
      'PX',
      // More than ttlMs left: it reads as younger than a second however late the request reaches Redis.
      ttlMs + 60_000,
    )
    expect(await leased.execute(young)).toMatchObject({ kind: 'in_progress' })
    expect(counter.calls).toBe(0)
    const stale = pay(freshKey('tenant'), freshKey())
    await redis.set(
      leaseKeyOf(prefix, stale),
      JSON.stringify({ t: 'dead', f: stale.fingerprint }),
      'PX',
      ttlMs - 5_000,
    )
    expect(await leased.execute(stale)).toMatchObject({ kind: 'executed' })
    expect(await countPayments(db.pool, stale.scope)).toBe(1)
  })

  it('names the bad option', () => {
    const { engine } = engineFor(db.pool)
    expect(() => withSoftLease(engine, { redis, ttlMs: -5 })).toThrow('Expected `ttlMs`')
    expect(() => withSoftLease(engine, { redis, onRedisError: 'maybe' as 'fail-closed' })).toThrow(
      'onRedisError',
    )
    expect(() => withSoftLease(engine, { redis, breakerMs: 0 })).toThrow('Expected `breakerMs`')
    expect(() => withSoftLease(engine, { redis: {} as never })).toThrow(
      'Expected `redis` to be an ioredis client.',
    )
  })
})
