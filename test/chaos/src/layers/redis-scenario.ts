/**
 * The Redis soft lease with Redis cut mid-run: concurrent duplicate requests go through `withSoftLease`, whose
 * ioredis client reaches Redis through the suite's FaultProxy (tcp mode). At a seeded moment the proxy destroys
 * every connection and black-holes the new ones (Redis "stops" while leases are held and requests are in flight);
 * at a seeded later moment it heals. The lease is never authoritative, so the check is that Postgres still made
 * exactly one effect per key, none missing, and that every answer was one a client can act on.
 */
import { createEngine, type ExecuteInput, migrate, type Outcome, postgresStore } from '@oncely/server'
import { withSoftLease } from '@oncely/server/redis'
import { createTestDatabase } from '@oncely/test-support'
import { Redis } from 'ioredis'
import { FaultProxy } from '../proxy.js'
import type { Random } from '../random.js'
import { type ScenarioResult, sleep } from './services.js'

export const REDIS_FAULTS = ['redis-cut', 'redis-black-holed-connection', 'redis-error-fall-through'] as const

export interface RedisScenarioOptions {
  random: Random
  redisUrl: string
  /** @default 30 */
  keys?: number
  /** Concurrent duplicates per key. @default 6 */
  duplicates?: number
}

const ANSWERS = new Set(['executed', 'replayed', 'in_progress'])

export async function runRedisScenario(options: RedisScenarioOptions): Promise<ScenarioResult> {
  const started = Date.now()
  const plan = options.random.fork('redis')
  const keys = options.keys ?? 30
  const duplicates = options.duplicates ?? 6
  const faults: Record<string, number> = Object.fromEntries(REDIS_FAULTS.map((kind) => [kind, 0]))
  const violations: string[] = []
  const target = new URL(options.redisUrl)
  const db = await createTestDatabase('chaos-layers-redis', { max: 20 })
  const proxy = await FaultProxy.start({
    name: 'proxy-redis',
    protocol: 'tcp',
    upstream: { host: target.hostname, port: Number(target.port || 6379) },
    random: plan.fork('proxy'),
  })
  const redis = new Redis({
    host: '127.0.0.1',
    port: proxy.port,
    lazyConnect: true,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    // A black-holed connection never becomes ready: give up on it quickly and reconnect, so healing is seen.
    connectTimeout: 500,
    retryStrategy: () => 100,
  })
  redis.on('error', () => {})
  try {
    await migrate(db.pool)
    await db.pool.query('CREATE TABLE effects (key text NOT NULL)')
    await redis.connect()
    const engine = withSoftLease(createEngine({ store: postgresStore({ pool: db.pool }), leaseMs: 2_000 }), {
      redis,
      prefix: `oncely:chaos:${plan.seed}:${Date.now()}:`,
      onError: () => faults['redis-error-fall-through']!++,
    })
    const request = (key: string): ExecuteInput => ({
      scope: 'chaos',
      operation: 'POST /payments',
      key,
      fingerprint: 'f',
      handler: async ({ tx }) => {
        await sleep(plan.int(50, 200))
        await tx.query('INSERT INTO effects (key) VALUES ($1)', [key])
        return { status: 201 }
      },
    })
    const names = Array.from({ length: keys }, (_, i) => `key-${i}`)
    const gapMs = 60
    const cutAtMs = plan.int(200, gapMs * keys - 600)
    const healAfterMs = plan.int(400, 1_200)
    const nemesis = (async () => {
      await sleep(cutAtMs)
      proxy.setRates({ 'black-hole': 1 })
      proxy.killAll()
      faults['redis-cut']!++
      await sleep(healAfterMs)
      proxy.setRates({})
      proxy.killAll() // drop the black-holed sockets so the client reconnects through a healthy path
    })()
    const outcomes: Outcome[] = []
    const waves = names.map(async (key, i) => {
      await sleep(i * gapMs)
      const answers = await Promise.all(
        Array.from({ length: duplicates }, () => engine.execute(request(key))),
      )
      outcomes.push(...answers)
    })
    await Promise.all([...waves, nemesis])
    // The final pass: every key is asked again until it answers executed or replayed (none left behind).
    for (const key of names) {
      for (let tries = 0; ; tries++) {
        const outcome = await engine.execute(request(key))
        outcomes.push(outcome)
        if (outcome.kind === 'executed' || outcome.kind === 'replayed') break
        if (tries > 50) {
          violations.push(`key ${key} still answers ${outcome.kind} after the heal`)
          break
        }
        await sleep(outcome.kind === 'in_progress' ? Math.min(outcome.retryAfterMs, 500) : 100)
      }
    }
    faults['redis-black-holed-connection'] = proxy.counts['black-hole']
    for (const outcome of outcomes) {
      if (!ANSWERS.has(outcome.kind)) violations.push(`unexpected answer ${outcome.kind}`)
    }
    const executed = outcomes.filter((outcome) => outcome.kind === 'executed').length
    if (executed !== keys) violations.push(`${executed} executions for ${keys} keys`)
    const { rows } = await db.pool.query<{ key: string; n: number }>(
      'SELECT key, count(*)::int AS n FROM effects GROUP BY key',
    )
    const effects = new Map(rows.map((row) => [row.key, row.n]))
    for (const key of names) {
      const n = effects.get(key) ?? 0
      if (n !== 1) violations.push(`key ${key} has ${n} effects, expected 1`)
    }
    return {
      faults,
      violations,
      durationMs: Date.now() - started,
      stats: {
        keys,
        requests: outcomes.length,
        inProgress: outcomes.filter((outcome) => outcome.kind === 'in_progress').length,
        cutAtMs,
        healAfterMs,
      },
    }
  } finally {
    redis.disconnect()
    await proxy.close()
    await db.drop()
  }
}
