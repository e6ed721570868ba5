// Fault injection for tests and chaos runs: an engine whose attempts can be interrupted at each step of the protocol,
// and, to prove a checker detects duplicates, one whose fence is switched off. Never for production code paths.
import { buildEngine } from '../engine/engine.js'
import type { FaultOptions } from '../engine/faults.js'
import type { Engine, EngineOptions } from '../engine/types.js'

export type { EngineHookContext, EngineHooks, FaultOptions } from '../engine/faults.js'

/** Options of {@link createEngineForTesting}: the engine's, plus fault injection. */
export interface TestingEngineOptions extends EngineOptions, FaultOptions {}

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
export function createEngineForTesting(options: TestingEngineOptions): Engine {
  if (typeof options !== 'object' || options === null)
    throw new TypeError('Expected `options` to be an object.')
  const { hooks, unsafe, ...engineOptions } = options
  if (hooks !== undefined && (typeof hooks !== 'object' || hooks === null)) {
    throw new TypeError('Expected `hooks` to be an object.')
  }
  return buildEngine(engineOptions, { hooks, unsafe })
}
