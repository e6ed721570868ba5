// Fault injection for tests and chaos runs: an engine whose attempts can be interrupted at each step of the protocol,
// and, to prove a checker detects duplicates, one whose fence is switched off. Never for production code paths.
import type { PoolClient } from 'pg'
import { buildEngine } from '../engine/engine.js'
import type { FaultOptions } from '../engine/faults.js'
import type { Engine, EngineOptions, ExecutionContext, HandlerResponse } from '../engine/types.js'
import { objectOption, objectOptions } from '../options/check.js'
import {
  buildDispatcher,
  type Dispatcher,
  type DispatcherHooks,
  type DispatcherOptions,
} from '../outbox/dispatcher.js'
import { buildSteps, type StepsHooks, type StepsOptions } from '../steps/steps.js'

export type { EngineHookContext, EngineHooks, FaultOptions } from '../engine/faults.js'
export type { DispatcherHooks } from '../outbox/dispatcher.js'
export type { StepsHooks } from '../steps/steps.js'

/** Options of {@link createEngineForTesting}: the engine's, plus fault injection. */
export interface TestingEngineOptions<Tx = PoolClient> extends EngineOptions<Tx>, FaultOptions<Tx> {}

/**
 * Creates an engine like `createEngine`, with fault-injection hooks and, for chaos runs that must see the checker
 * fail, the fence switched off.
 *
 * @example
 * const engine = createEngineForTesting({
 *   store,
 *   hooks: { beforeCommit: () => { throw new Error('crash before commit') } },
 * })
 */
export function createEngineForTesting<Tx = PoolClient>(options: TestingEngineOptions<Tx>): Engine<Tx> {
  objectOptions('createEngineForTesting()', options)
  const { hooks, unsafe, ...engineOptions } = options
  if (hooks !== undefined) objectOption('hooks', hooks)
  if (unsafe !== undefined) objectOption('unsafe', unsafe)
  return buildEngine(engineOptions, { hooks, unsafe })
}

/**
 * `steps()` from `@oncely/server/steps`, with `hooks.afterStep` called after each step committed (throw there to
 * simulate a crash between steps).
 *
 * @example
 * const handler = stepsForTesting({ pool, steps, finish, hooks: { afterStep: (name) => { if (name === 'charge') throw crash } } })
 */
export function stepsForTesting<S extends object = Record<string, unknown>, Tx = PoolClient>(
  options: StepsOptions<S, Tx> & { hooks?: StepsHooks },
): (ctx: ExecutionContext<Tx>) => Promise<HandlerResponse> {
  objectOptions('stepsForTesting()', options)
  const { hooks, ...stepsOptions } = options
  if (hooks !== undefined) objectOption('hooks', hooks)
  return buildSteps(stepsOptions as StepsOptions<S, Tx>, hooks ?? {})
}

/**
 * `createDispatcher()` from `@oncely/server/outbox`, with `hooks.afterPublish` called between a publish and its mark
 * (throw or exit there to simulate a dispatcher dying in that window).
 *
 * @example
 * createDispatcherForTesting({ pool, publisher, hooks: { afterPublish: () => process.kill(process.pid, 'SIGKILL') } })
 */
export function createDispatcherForTesting(
  options: DispatcherOptions & { hooks?: DispatcherHooks },
): Dispatcher {
  objectOptions('createDispatcherForTesting()', options)
  const { hooks, ...dispatcherOptions } = options
  if (hooks !== undefined) objectOption('hooks', hooks)
  return buildDispatcher(dispatcherOptions, hooks ?? {})
}
