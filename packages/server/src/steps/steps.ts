import type pg from 'pg'
import { defaultClassify } from '../engine/classify.js'
import type { ErrorClass, ExecutionContext, HandlerResponse } from '../engine/types.js'
import { StepFencedOutError } from '../errors/step-fenced-out-error.js'
import { STORE_DATABASE } from '../hooks.js'
import { objectOptions, optionalFunction, refuseTestingOptions, requiredFunction } from '../options/check.js'
import { poolOrDatabase } from '../options/datasource.js'
import type { Database } from '../store/database.js'

/** What a step receives. */
export interface StepContext<S, Tx = pg.PoolClient> {
  /** This step's own transaction: its writes commit together with the recovery point past this step. */
  tx: Tx
  /** The state so far: `initialState` merged with what earlier steps returned (restored after a crash). */
  state: Readonly<S>
  /** The deterministic key for this step's external call: `ctx.stepKey(step.name)`. Send it to the provider. */
  stepKey: string
  /** The engine attempt running this step (2+ means an earlier attempt crashed or failed somewhere). */
  attempt: number
  signal: AbortSignal
}

/** One atomic phase. */
export interface Step<S, Tx = pg.PoolClient> {
  /** Unique and stable across deploys: it is the recovery point and part of the external key. */
  name: string
  /**
   * The work: at most one external call (with `ctx.stepKey`) plus local writes on `ctx.tx`. Returns fields to merge
   * into the state (JSON only: the state is stored with the recovery point). May run again after a crash inside
   * it, so the external call must be idempotent under `stepKey`.
   */
  run(ctx: StepContext<S, Tx>): Promise<Partial<S> | undefined> | Partial<S> | undefined
  /**
   * Undoes this step when a later step (or `finish`) fails permanently: refund a charge, release a hold. Runs in its
   * own transaction, in reverse order; `ctx.stepKey` is derived from `<name>:compensate`. Must be idempotent: a
   * crash during compensation runs it again on the next attempt.
   */
  compensate?(ctx: StepContext<S, Tx>): Promise<void> | void
}

/** Options of {@link steps}. */
export interface StepsOptions<S, Tx = pg.PoolClient> {
  /**
   * The node-postgres pool the steps' own transactions come from, on the engine's database (the recovery point is
   * saved in them), but not the engine's own pool: each execution holds a connection of that one while a step
   * takes another. Give `database` instead for another library's datasource.
   */
  pool?: pg.Pool
  /** The datasource the steps' own transactions come from, instead of `pool` (not the engine's own datasource). */
  database?: Database<Tx>
  /** The phases, in order. */
  steps: readonly Step<S, Tx>[]
  /** The state before the first step. Store the request fields a re-drive needs here. @default {} */
  initialState?: S
  /** The last phase: runs in the engine's transaction (`tx`), which also stores the response. */
  finish(ctx: { tx: Tx; state: Readonly<S>; attempt: number }): Promise<HandlerResponse> | HandlerResponse
  /**
   * Which step errors are permanent (compensate, then store the failure) rather than retryable (resume later).
   * Pass the same function to `engine.execute({ classify })`.
   * @default defaultClassify (HTTP 4xx is permanent)
   */
  classify?: (error: unknown) => ErrorClass
}

/** Fault injection for tests (see `@oncely/server/testing`): `afterStep` runs after a step committed. */
export interface StepsHooks {
  afterStep?: (name: string) => Promise<void> | void
}

/** The recovery point as stored: the last committed step and the state after it. */
export interface RecoveryPoint<S = unknown> {
  step: string
  state: S
}

/** Reads a recovery point written by {@link steps}; `null` for none or for one written by other code. */
export function parseRecoveryPoint<S = unknown>(point: string | null): RecoveryPoint<S> | null {
  if (point === null) return null
  try {
    const parsed = JSON.parse(point) as { oncely?: unknown; step?: unknown; state?: S }
    if (parsed?.oncely !== 'steps/1' || typeof parsed.step !== 'string') return null
    return { step: parsed.step, state: parsed.state as S }
  } catch {
    return null
  }
}

/**
 * Builds an engine handler from atomic phases with recovery points: each step's local writes and the
 * recovery point past it commit in the step's own transaction, so a retry or a takeover resumes after the last
 * committed step and never repeats one that finished. External calls carry `stepKey`, derived from (scope,
 * operation, key, step), so a step that crashed mid-way and runs again is deduplicated by the provider. Needs two
 * pool connections per execution (the engine's transaction stays open for `finish`).
 *
 * @example
 * await engine.execute({ ...request, handler: steps({
 *   pool,
 *   initialState: { amount },
 *   steps: [{
 *     name: 'charge',
 *     run: async ({ stepKey, state }) => ({ chargeId: (await provider.charge(state.amount, { idempotencyKey: stepKey })).id }),
 *     compensate: ({ stepKey, state }) => provider.refund(state.chargeId, { idempotencyKey: stepKey }),
 *   }],
 *   finish: async ({ tx, state }) => ({ status: 201, body: await insertPayment(tx, state) }),
 * }) })
 */
export function steps<S extends object = Record<string, unknown>, Tx = pg.PoolClient>(
  options: StepsOptions<S, Tx>,
): (ctx: ExecutionContext<Tx>) => Promise<HandlerResponse> {
  refuseTestingOptions('steps()', options, ['hooks'], 'stepsForTesting()')
  return buildSteps(options, {})
}

/** {@link steps} with fault injection (see `@oncely/server/testing`). */
export function buildSteps<S extends object, Tx = pg.PoolClient>(
  options: StepsOptions<S, Tx>,
  hooks: StepsHooks,
): (ctx: ExecutionContext<Tx>) => Promise<HandlerResponse> {
  objectOptions('steps()', options)
  const database = poolOrDatabase<Tx>('steps()', options)
  if (!Array.isArray(options.steps)) throw new TypeError('Expected `steps` to be an array.')
  const names = new Set<string>()
  for (const step of options.steps) {
    if (typeof step?.name !== 'string' || step.name === '' || names.has(step.name)) {
      throw new TypeError('Expected every step to have a unique, non-empty `name`.')
    }
    if (typeof step.run !== 'function')
      throw new TypeError(`Expected step \`${step.name}\` to have a \`run\` function.`)
    names.add(step.name)
  }
  requiredFunction('finish', options.finish)
  const classify = optionalFunction('classify', options.classify) ?? defaultClassify
  const list = options.steps

  return async (ctx) => {
    const engines = (ctx as unknown as { [STORE_DATABASE]?: Database<Tx> })[STORE_DATABASE]
    if (engines !== undefined && engines.source === database.source) {
      throw new TypeError(
        "Expected `pool` of steps() not to be the engine's own pool: each execution holds one of its connections until it answers, and each step would wait for another, so a burst of pool-size executions would wait for each other forever. Give the steps a pool of their own: steps({ pool: new pg.Pool(...) }).",
      )
    }
    const restored = parseRecoveryPoint<S>(ctx.recoveryPoint)
    let state = (restored?.state ?? options.initialState ?? {}) as S
    let next = 0
    if (restored) {
      next = list.findIndex((step) => step.name === restored.step) + 1
      if (next === 0) throw new Error(`The recovery point names an unknown step "${restored.step}".`)
    }
    const context = (tx: Tx, stepKey: string): StepContext<S, Tx> => ({
      tx,
      state,
      stepKey,
      attempt: ctx.attempt,
      signal: ctx.signal,
    })
    const permanent = (error: unknown) =>
      !(error instanceof StepFencedOutError) && classify(error) === 'permanent'
    const compensate = async (before: number) => {
      for (const done of list.slice(0, before).reverse()) {
        if (!done.compensate) continue
        await database.transaction(async (tx) => {
          await done.compensate?.(context(tx, ctx.stepKey(`${done.name}:compensate`)))
        })
      }
    }

    for (let index = next; index < list.length; index++) {
      const step = list[index] as Step<S, Tx>
      try {
        state = await database.transaction(async (tx) => {
          const patch = await step.run(context(tx, ctx.stepKey(step.name)))
          const after = { ...state, ...(patch ?? {}) }
          const point = JSON.stringify({ oncely: 'steps/1', step: step.name, state: after })
          if (!(await ctx.saveRecoveryPoint(point, tx))) throw new StepFencedOutError(step.name)
          return after
        })
      } catch (error) {
        if (permanent(error)) await compensate(index)
        throw error
      }
      await hooks.afterStep?.(step.name)
    }
    try {
      return await options.finish({ tx: ctx.tx, state, attempt: ctx.attempt })
    } catch (error) {
      if (permanent(error)) await compensate(list.length)
      throw error
    }
  }
}
