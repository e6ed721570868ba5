/**
 * Fault hooks for the chaos suite: the request path calls `faults.at(point)` at each step of the protocol; with
 * chaos configured the process may SIGKILL itself or hold the request there. Without it `at` does nothing.
 */
import { writeSync } from 'node:fs'
import { setTimeout as sleep } from 'node:timers/promises'
import type { ChaosConfig, ChaosPoint } from './config.js'

/** The hooks the request path calls. */
export interface Faults {
  /** Runs the faults configured for `point`: resolves after an injected delay, or never (the process is killed). */
  at(point: ChaosPoint): Promise<void>
}

/** Faults that never fire. */
export const noFaults: Faults = { at: async () => {} }

// mulberry32: a tiny seeded generator, so a seed reproduces which requests crash.
function seeded(seed: number): () => number {
  let state = seed >>> 0
  return () => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296
  }
}

/**
 * Builds the hooks from the chaos configuration (`undefined` gives {@link noFaults}).
 *
 * @example
 * const faults = createFaults(config.chaos)
 * await faults.at('after-provider')
 */
export function createFaults(chaos: ChaosConfig | undefined, effects: FaultEffects = defaultEffects): Faults {
  const { kill, report } = effects
  if (!chaos || (chaos.crashAt.size === 0 && chaos.delayAt.size === 0)) return noFaults
  const random = chaos.seed === undefined ? Math.random : seeded(chaos.seed)
  return {
    async at(point) {
      if (chaos.delayAt.has(point) && chaos.delayMs > 0 && random() < chaos.delayRate) {
        report(`ONCELY_CHAOS delay ${point} ${chaos.delayMs}ms pid=${process.pid}`)
        await sleep(chaos.delayMs)
      }
      if (chaos.crashAt.has(point) && random() < chaos.crashRate) {
        report(`ONCELY_CHAOS crash ${point} pid=${process.pid}`)
        kill()
      }
    },
  }
}

/** What a fault does; replaceable so tests can observe faults without dying. */
export interface FaultEffects {
  /** Ends the process. */
  kill(): void
  /** Announces a fault on one line, before it happens. */
  report(line: string): void
}

const defaultEffects: FaultEffects = {
  // SIGKILL, not exit(): no finally blocks, no connection cleanup, exactly like a power cut.
  kill: () => process.kill(process.pid, 'SIGKILL'),
  // Synchronous, so the line is out before the process dies; the chaos suite counts faults per point from it.
  report: (line) => writeSync(2, `${line}\n`),
}
