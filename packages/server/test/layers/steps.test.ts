import { JsonSyntaxError } from '@oncely/protocol'
import { type TestDatabase, waitFor } from '@oncely/test-support'
import pg from 'pg'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type ExecuteInput, type Outcome, postgresStore, stepKeyFor } from '../../src/index.js'
import { type AbandonedIntent, createCompleter, type Step, steps } from '../../src/steps/index.js'
import { stepsForTesting } from '../../src/testing/index.js'
import { engineFor, fingerprintOf, freshKey, reservation, setupDatabase } from '../helpers.js'

let db: TestDatabase
/** The steps' own transactions come from a pool of their own: the engine's connection stays open meanwhile. */
let stepsPool: pg.Pool
beforeAll(async () => {
  db = await setupDatabase('steps')
  stepsPool = new pg.Pool({ connectionString: db.url, max: 10 })
  stepsPool.on('error', () => {})
  await db.pool.query('CREATE TABLE step_writes (key text NOT NULL, step text NOT NULL)')
})
afterAll(async () => {
  await stepsPool.end()
  await db.drop()
})

/** A fake external provider with its own idempotency: a repeated key returns the first result, no new effect. */
function fakeProvider() {
  const calls = new Map<string, number>()
  const effects = new Map<string, string>()
  return {
    calls,
    effects,
    async call(kind: string, key: string): Promise<string> {
      calls.set(key, (calls.get(key) ?? 0) + 1)
      if (!effects.has(key)) effects.set(key, `${kind}_${effects.size + 1}`)
      return effects.get(key) as string
    },
  }
}

type State = { amount: number; holdId?: string; chargeId?: string; shipmentId?: string }

class Declined extends Error {
  statusCode = 402
}

function paymentFlow(
  provider: ReturnType<typeof fakeProvider>,
  key: string,
  opts: { crashAfter?: string; crashInside?: string; declineAt?: string; compensated?: string[] } = {},
) {
  let crashedAfter = false
  let crashedInside = false
  const write = (tx: { query: (q: string, v: unknown[]) => Promise<unknown> }, step: string) =>
    tx.query('INSERT INTO step_writes VALUES ($1, $2)', [key, step])
  const step = (name: string, field: keyof State): Step<State> => ({
    name,
    run: async ({ tx, stepKey }) => {
      if (opts.declineAt === name) throw new Declined('card declined')
      const id = await provider.call(name, stepKey)
      await write(tx, name)
      if (opts.crashInside === name && !crashedInside) {
        crashedInside = true
        throw new Error(`crash inside ${name}, after the provider call, before the commit`)
      }
      return { [field]: id } as Partial<State>
    },
    compensate: async ({ stepKey }) => {
      await provider.call(`undo_${name}`, stepKey)
      opts.compensated?.push(name)
    },
  })
  return stepsForTesting<State>({
    pool: stepsPool,
    initialState: { amount: 100 },
    steps: [step('hold', 'holdId'), step('charge', 'chargeId'), step('ship', 'shipmentId')],
    hooks: {
      afterStep: (name) => {
        if (opts.crashAfter === name && !crashedAfter) {
          crashedAfter = true
          throw new Error(`crash after ${name}`)
        }
      },
    },
    finish: async ({ tx, state }) => {
      await write(tx, 'finish')
      return { status: 201, body: state }
    },
  })
}

async function writesOf(key: string) {
  const { rows } = await db.pool.query(
    'SELECT step, count(*)::int AS n FROM step_writes WHERE key = $1 GROUP BY step ORDER BY step',
    [key],
  )
  return Object.fromEntries(rows.map((r) => [r.step, r.n]))
}

async function untilDone(run: () => Promise<Outcome>): Promise<Outcome[]> {
  const outcomes: Outcome[] = []
  for (let i = 0; i < 5; i++) {
    const outcome = await run().catch(
      (error) => ({ kind: 'retryable_failure', reason: 'error', error }) as Outcome,
    )
    outcomes.push(outcome)
    if (outcome.kind === 'executed') break
  }
  return outcomes
}

// Under 'lock', the first recovery point writes the row the row protocol would have.
describe(`steps with recovery points (reservation: '${reservation}')`, () => {
  for (const crashAfter of ['hold', 'charge', 'ship']) {
    it(`killed after step "${crashAfter}" resumes there and calls the provider once per step`, async () => {
      const { engine } = engineFor(db.pool, { reservation })
      const provider = fakeProvider()
      const key = freshKey()
      const handler = paymentFlow(provider, key, { crashAfter })
      const input: ExecuteInput = { scope: 't', operation: 'POST /pay', key, fingerprint: 'f', handler }
      const outcomes = await untilDone(() => engine.execute(input))
      expect(outcomes.map((o) => o.kind)).toEqual(['retryable_failure', 'executed'])
      expect([...provider.calls.values()]).toEqual([1, 1, 1])
      expect(await writesOf(key)).toEqual({ charge: 1, finish: 1, hold: 1, ship: 1 })
      const done = outcomes[1]
      const body = done?.kind === 'executed' ? JSON.parse(done.response.body.toString()) : undefined
      expect(body).toEqual({ amount: 100, holdId: 'hold_1', chargeId: 'charge_2', shipmentId: 'ship_3' })
      // Step keys are the engine's deterministic ones.
      const stepKeys = new Set(['hold', 'charge', 'ship'].map((s) => engineStepKey(key, s)))
      expect(new Set(provider.calls.keys())).toEqual(stepKeys)
    })
  }

  it('a crash inside a step (after the provider call, before its commit) re-runs it under the same key: one effect', async () => {
    const { engine } = engineFor(db.pool, { reservation })
    const provider = fakeProvider()
    const key = freshKey()
    const input: ExecuteInput = {
      scope: 't',
      operation: 'POST /pay',
      key,
      fingerprint: 'f',
      handler: paymentFlow(provider, key, { crashInside: 'charge' }),
    }
    await untilDone(() => engine.execute(input))
    expect(provider.calls.get(engineStepKey(key, 'charge'))).toBe(2)
    expect(provider.effects.size).toBe(3)
    expect(await writesOf(key)).toEqual({ charge: 1, finish: 1, hold: 1, ship: 1 })
  })

  it('compensates finished steps in reverse when a later step fails permanently, and stores the failure', async () => {
    const { engine } = engineFor(db.pool, { reservation })
    const provider = fakeProvider()
    const key = freshKey()
    const compensated: string[] = []
    const input: ExecuteInput = {
      scope: 't',
      operation: 'POST /pay',
      key,
      fingerprint: 'f',
      handler: paymentFlow(provider, key, { declineAt: 'ship', compensated }),
    }
    const outcome = await engine.execute(input)
    expect(outcome).toMatchObject({
      kind: 'executed',
      status: 'failed_permanent',
      response: { status: 402 },
    })
    expect(compensated).toEqual(['charge', 'hold'])
    expect(provider.calls.get(engineStepKey(key, 'charge:compensate'))).toBe(1)
    expect((await engine.execute(input)).kind).toBe('replayed')
  })

  it('the completer re-drives an intent abandoned after its steps, once the grace period passed', async () => {
    // Long enough that a loaded machine cannot outlast lease and grace between the crash and the first look.
    const leaseMs = 1_000
    const graceMs = 100
    const { engine } = engineFor(db.pool, {
      reservation,
      leaseMs,
      hooks: {
        beforeCommit: ({ key }) => {
          if (!redriving.has(key)) throw new Error('SIGKILL before the final commit')
        },
      },
    })
    const redriving = new Set<string>()
    const provider = fakeProvider()
    const key = freshKey()
    const handler = paymentFlow(provider, key)
    const input: ExecuteInput = {
      scope: freshKey('scope'),
      operation: 'POST /pay',
      key,
      fingerprint: fingerprintOf({ amount: 100 }),
      requestHeaders: { 'x-request-id': 'r-1' },
      handler,
    }
    const reservedAfter = Date.now()
    await expect(engine.execute(input)).rejects.toThrow('SIGKILL')
    const found: AbandonedIntent<State>[] = []
    const completer = createCompleter<State>({
      store: postgresStore({ pool: db.pool }),
      graceMs,
      redrive: async (intent) => {
        if (intent.scope !== input.scope) return
        found.push(intent)
        redriving.add(intent.key)
        // Everything a re-drive needs comes from the record: no fingerprint to recompute, no request to rebuild.
        expect(intent.steps?.state.amount).toBe(100)
        // A lease a loaded machine cannot outrun while the steps run outside the engine's transaction.
        const outcome = await engine.execute({ ...intent.request, handler, leaseMs: 5_000 })
        expect(outcome.kind).toBe('executed')
      },
    })
    await completer.runOnce()
    expect(found).toEqual([]) // the lease has not run out plus the grace period yet
    await waitFor('the re-drive once lease and grace passed', async () => {
      await completer.runOnce()
      return found.length > 0
    })
    // Not before lease and grace ran out (less a little for Postgres's clock against this process's).
    expect(Date.now() - reservedAfter).toBeGreaterThanOrEqual(leaseMs + graceMs - 50)
    expect(found).toMatchObject([
      {
        key,
        fingerprint: input.fingerprint,
        request: {
          scope: input.scope,
          operation: 'POST /pay',
          key,
          fingerprint: input.fingerprint,
          requestHeaders: { 'x-request-id': 'r-1' },
        },
        status: 'in_progress',
        attempts: 1,
        steps: { step: 'ship', state: { amount: 100 } },
      },
    ])
    expect([...provider.calls.values()]).toEqual([1, 1, 1])
    expect(await writesOf(key)).toEqual({ charge: 1, finish: 1, hold: 1, ship: 1 })
  })

  it("refuses the engine's own pool, whose connections every execution would wait for while holding one", async () => {
    const { engine } = engineFor(db.pool)
    const handler = steps({ pool: db.pool, steps: [{ name: 'a', run: () => undefined }], finish: () => ({}) })
    const outcome = await engine.execute({
      scope: 's',
      operation: 'POST /pay',
      key: freshKey(),
      fingerprint: fingerprintOf({}),
      handler,
    })
    expect(outcome).toMatchObject({ kind: 'retryable_failure', reason: 'error' })
    if (outcome.kind === 'retryable_failure')
      expect(String(outcome.error)).toContain("Expected `pool` of steps() not to be the engine's own pool")
  })

  it('names the bad option', () => {
    expect(() =>
      steps({
        pool: db.pool,
        steps: [
          { name: 'a', run: () => undefined },
          { name: 'a', run: () => undefined },
        ],
        finish: () => ({}),
      }),
    ).toThrow('unique')
    expect(() =>
      steps({ pool: db.pool, steps: [], finish: () => ({}), hooks: {} } as unknown as Parameters<
        typeof steps
      >[0]),
    ).toThrow(
      "`hooks` is not an option of steps(): fault injection is for tests, through stepsForTesting() from '@oncely/server/testing'.",
    )
    expect(() => createCompleter({ store: {} as never, redrive: async () => {} })).toThrow('Expected `store`')
  })
})

const engineStepKey = (key: string, step: string) => stepKeyFor('t', 'POST /pay', key, step)

describe('stepKeyFor', () => {
  it('refuses a step name with a lone surrogate instead of hashing a text no UTF-8 system can hold', () => {
    expect(stepKeyFor('t', 'POST /pay', 'k', 'charge')).toMatch(/^[0-9a-f]{64}$/)
    expect(() => stepKeyFor('t', 'POST /pay', 'k', 'charge\ud800')).toThrow(JsonSyntaxError)
    expect(() => stepKeyFor('t', 'POST /pay', 'k', 'charge\ud800')).toThrow(/Lone surrogate/)
  })
})
