/**
 * Multi-step handlers crashed at seeded steps: each key runs a three-step flow (`hold`, `charge`, `ship`, each one
 * external call with its deterministic step key, then `finish`) built with `steps()`. The seed decides, per key,
 * whether an attempt crashes after a step committed (thrown at `afterStep`) or inside a step after its provider
 * call and before its commit, and at which step; two concurrent callers drive each key until it is done. The
 * check: each step key reached the provider's effect once (a step re-run after a crash inside it calls again with
 * the same key, which the provider deduplicates, and nothing else calls twice), one local write per step, and one
 * final effect per key.
 */
import { randomUUID } from 'node:crypto'
import { createEngine, type ExecuteInput, migrate, type Outcome, postgresStore } from '@oncely/server'
import type { Step } from '@oncely/server/steps'
import { stepsForTesting } from '@oncely/server/testing'
import { createTestDatabase } from '@oncely/test-support'
import pg from 'pg'
import type { Random } from '../random.js'
import { type ScenarioResult, sleep } from './services.js'

export const STEPS_FAULTS = ['crash-after-step', 'crash-inside-step'] as const

const STEP_NAMES = ['hold', 'charge', 'ship'] as const

export interface StepsScenarioOptions {
  random: Random
  /** @default 24 */
  keys?: number
  /**
   * UNSAFE, to prove the check can fail: send the provider a fresh key per call instead of the step's
   * deterministic one, so a step re-run after a crash inside it charges twice.
   * @default false
   */
  unsafeRandomStepKeys?: boolean
}

type State = Record<string, string>

export async function runStepsScenario(options: StepsScenarioOptions): Promise<ScenarioResult> {
  const started = Date.now()
  const plan = options.random.fork('steps')
  const keys = options.keys ?? 24
  const faults: Record<string, number> = Object.fromEntries(STEPS_FAULTS.map((kind) => [kind, 0]))
  const violations: string[] = []
  // The fake provider: calls and effects per step key; a repeated key returns the first effect.
  const calls = new Map<string, number>()
  const effects = new Map<string, string>()
  const db = await createTestDatabase('chaos-layers-steps', { max: 20 })
  let closeStepsPool = async () => {}
  try {
    await migrate(db.pool)
    await db.pool.query('CREATE TABLE step_writes (key text NOT NULL, step text NOT NULL)')
    await db.pool.query('CREATE TABLE payments (key text NOT NULL)')
    const engine = createEngine({ store: postgresStore({ pool: db.pool }), leaseMs: 2_000 })
    // The steps' own transactions come from a pool of their own: the engine's connection stays open meanwhile.
    const stepsPool = new pg.Pool({ connectionString: db.url, max: 20 })
    stepsPool.on('error', () => {})
    closeStepsPool = () => stepsPool.end()
    const flow = (key: string, crash: { kind: (typeof STEPS_FAULTS)[number]; step: string } | undefined) => {
      const step = (name: string): Step<State> => ({
        name,
        run: async ({ tx, stepKey: derived }) => {
          const stepKey = options.unsafeRandomStepKeys ? `${derived}:${randomUUID()}` : derived
          calls.set(stepKey, (calls.get(stepKey) ?? 0) + 1)
          if (!effects.has(stepKey)) effects.set(stepKey, `${name}_${effects.size + 1}`)
          await tx.query('INSERT INTO step_writes VALUES ($1, $2)', [key, name])
          if (crash?.kind === 'crash-inside-step' && crash.step === name) {
            faults['crash-inside-step']!++
            crash = undefined
            throw new Error(`chaos: crash inside ${name}, after the provider call, before the commit`)
          }
          return { [name]: effects.get(stepKey) as string }
        },
      })
      return stepsForTesting<State>({
        pool: stepsPool,
        steps: STEP_NAMES.map(step),
        hooks: {
          afterStep: (name) => {
            if (crash?.kind === 'crash-after-step' && crash.step === name) {
              faults['crash-after-step']!++
              crash = undefined
              throw new Error(`chaos: crash after ${name}`)
            }
          },
        },
        finish: async ({ tx, state }) => {
          await tx.query('INSERT INTO payments VALUES ($1)', [key])
          return { status: 201, body: state }
        },
      })
    }
    const names = Array.from({ length: keys }, (_, i) => `key-${i}`)
    // Keys run four at a time, each execution holding a connection of each pool (the engine's transaction stays
    // open for `finish` while each step takes its own).
    const runKey = async (key: string, i: number) => {
      // Each key's crash is armed once across its callers: the crash happens on whichever attempt reaches it.
      const kind = i < 2 ? STEPS_FAULTS[i]! : plan.pick([...STEPS_FAULTS, 'none'] as const)
      const armed = kind === 'none' ? undefined : { kind, step: plan.pick(STEP_NAMES) }
      const handler = flow(key, armed)
      const input: ExecuteInput = { scope: 'chaos', operation: 'POST /pay', key, fingerprint: 'f', handler }
      const caller = async () => {
        for (let tries = 0; tries < 40; tries++) {
          const outcome: Outcome = await engine
            .execute(input)
            .catch((error) => ({ kind: 'retryable_failure', reason: 'error', error }) as Outcome)
          if (outcome.kind === 'executed' || outcome.kind === 'replayed') return
          await sleep(outcome.kind === 'in_progress' ? Math.min(outcome.retryAfterMs, 200) : 50)
        }
        violations.push(`key ${key} was not done after 40 tries`)
      }
      await Promise.all([caller(), caller()])
    }
    for (let i = 0; i < names.length; i += 4) {
      await Promise.all(names.slice(i, i + 4).map((key, j) => runKey(key, i + j)))
    }
    const { rows: writes } = await db.pool.query<{ key: string; step: string; n: number }>(
      'SELECT key, step, count(*)::int AS n FROM step_writes GROUP BY key, step',
    )
    const { rows: payments } = await db.pool.query<{ key: string; n: number }>(
      'SELECT key, count(*)::int AS n FROM payments GROUP BY key',
    )
    const paid = new Map(payments.map((row) => [row.key, row.n]))
    for (const key of names) {
      if (paid.get(key) !== 1)
        violations.push(`key ${key} has ${paid.get(key) ?? 0} final effects, expected 1`)
      for (const step of STEP_NAMES) {
        const n = writes.find((row) => row.key === key && row.step === step)?.n ?? 0
        if (n !== 1) violations.push(`key ${key} step ${step} committed ${n} local writes, expected 1`)
      }
    }
    const stepKeys = keys * STEP_NAMES.length
    if (effects.size !== stepKeys) {
      violations.push(`the provider made ${effects.size} effects for ${stepKeys} step keys`)
    }
    // Only a step interrupted inside itself may call twice (same key, deduplicated); any other repeat is a bug.
    const repeats = [...calls.values()].filter((n) => n > 1)
    if (repeats.length > faults['crash-inside-step']! || repeats.some((n) => n > 2)) {
      violations.push(`provider calls repeated: ${JSON.stringify(repeats)}`)
    }
    return {
      faults,
      violations,
      durationMs: Date.now() - started,
      stats: { keys, stepKeys, providerCalls: [...calls.values()].reduce((a, b) => a + b, 0) },
    }
  } finally {
    await closeStepsPool()
    await db.drop()
  }
}
