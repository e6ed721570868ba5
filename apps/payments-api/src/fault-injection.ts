/**
 * Chaos only: the engine and the payment steps with the fault hooks of `@oncely/server/testing`. `app.ts` imports
 * this module dynamically, and only when the chaos suite runs the app (`ONCELY_CHAOS=1`) or a test hands it faults,
 * so the demo as users run it loads the public API alone, never the testing entry and its unsafe switches.
 */
import type { Engine, EngineOptions } from '@oncely/server'
import type { StepsOptions } from '@oncely/server/steps'
import { createEngineForTesting, stepsForTesting } from '@oncely/server/testing'
import type { Faults } from './faults.js'
import { CHARGE_STEP, type PaymentState, type StepsFactory } from './payment-steps.js'

/**
 * The engine with a fault point at each step of the protocol and, to prove the chaos checker sees duplicates, the
 * fence switched off when `disableFencing` is set.
 *
 * @example
 * const engine = faultyEngine(engineOptions, faults, false)
 */
export function faultyEngine(options: EngineOptions, faults: Faults, disableFencing: boolean): Engine {
  return createEngineForTesting({
    ...options,
    hooks: {
      afterReserve: () => faults.at('after-reserve'),
      beforeCommit: () => faults.at('before-commit'),
      afterCommit: () => faults.at('after-commit'),
    },
    unsafe: { disableFencing },
  })
}

/**
 * `steps()` with the `after-provider` fault point: past the charge step's commit, so a crash there resumes from the
 * recovery point.
 *
 * @example
 * const handle = createPaymentHandler({ stepsPool, provider, faults, steps: faultySteps(faults) })
 */
export function faultySteps(faults: Faults): StepsFactory {
  return (options: StepsOptions<PaymentState>) =>
    stepsForTesting<PaymentState>({
      ...options,
      hooks: { afterStep: (name) => (name === CHARGE_STEP ? faults.at('after-provider') : undefined) },
    })
}
