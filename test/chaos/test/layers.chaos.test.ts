import { afterAll, describe, expect, it } from 'vitest'
import { defaultLogDir, OUTBOX_FAULTS, runOutboxScenario } from '../src/layers/outbox-scenario.js'
import { REDIS_FAULTS, runRedisScenario } from '../src/layers/redis-scenario.js'
import { optionalService, type ScenarioResult } from '../src/layers/services.js'
import { runStepsScenario, STEPS_FAULTS } from '../src/layers/steps-scenario.js'
import { createRandom, randomSeed } from '../src/random.js'

// CHAOS_LAYERS_SEED reproduces a run; otherwise each run draws a seed (printed) so CI covers different mixes.
const seed = process.env.CHAOS_LAYERS_SEED ? Number(process.env.CHAOS_LAYERS_SEED) : randomSeed()
const random = createRandom(seed)
const nats = await optionalService('NATS_URL', 'nats://127.0.0.1:4222')
const redis = await optionalService('REDIS_URL', 'redis://127.0.0.1:6379')
if (nats.skip) console.warn(`skipping the outbox/inbox chaos scenario: ${nats.skip}`)
if (redis.skip) console.warn(`skipping the Redis soft-lease chaos scenario: ${redis.skip}`)

const summary: string[] = []
afterAll(() => {
  console.info(`layer chaos, seed ${seed} (reproduce: CHAOS_LAYERS_SEED=${seed})\n${summary.join('\n')}`)
})

/** Every injected kind happened at least once, and nothing was violated. */
function expectProved(name: string, result: ScenarioResult, kinds: readonly string[]) {
  summary.push(
    `  ${name}: ${result.violations.length} violations in ${(result.durationMs / 1000).toFixed(1)} s; faults ${JSON.stringify(result.faults)}; ${JSON.stringify(result.stats)}`,
  )
  const context = `seed ${seed} (CHAOS_LAYERS_SEED=${seed}): ${JSON.stringify(result)}`
  expect(result.violations, context).toEqual([])
  for (const kind of kinds)
    expect(result.faults[kind] ?? 0, `${kind} never happened; ${context}`).toBeGreaterThan(0)
}

describe('chaos: the other layers', () => {
  it.skipIf(nats.skip)(
    'outbox → JetStream → inbox: dispatchers and the consumer SIGKILLed, one effect per message',
    async () => {
      const result = await runOutboxScenario({
        random,
        natsUrl: nats.url,
        logDir: defaultLogDir(`layers-seed-${seed}`),
      })
      expectProved('outbox', result, OUTBOX_FAULTS)
      expect(result.stats.publishAttempts).toBeGreaterThan(result.stats.messages ?? 0)
    },
    90_000,
  )

  it.skipIf(redis.skip)(
    'Redis soft lease cut mid-run: one effect per key',
    async () => {
      const result = await runRedisScenario({ random, redisUrl: redis.url })
      expectProved('redis', result, REDIS_FAULTS)
    },
    60_000,
  )

  it('steps crashed after and inside seeded steps: one provider effect per step key, one final effect', async () => {
    const result = await runStepsScenario({ random })
    expectProved('steps', result, STEPS_FAULTS)
  }, 60_000)
})
