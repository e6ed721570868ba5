/**
 * Crash-point rotation: each incarnation of a process is armed with one crash point, the next of a seeded
 * shuffle, at a high rate during the first pass (so every point fires early, even in a short run) and a low one
 * after. A single fixed point set at a low rate leaves some points unexercised in short runs.
 */
import type { Random } from './random.js'

export interface Armed {
  point: string
  rate: number
}

export interface RotationOptions {
  /** Probability per pass through the point during the first pass over all points. @default 0.1 */
  firstRate?: number
  /** Probability afterwards. @default 0.02 */
  laterRate?: number
  /** How many arms make up the first pass (e.g. points x processes). @default points.length */
  firstPass?: number
}

/** Returns a function that arms the next incarnation, or `undefined` when there are no points. */
export function crashRotation(
  random: Random,
  points: readonly string[],
  options: RotationOptions = {},
): () => Armed | undefined {
  const order = [...points]
  for (let i = order.length - 1; i > 0; i--) {
    const j = random.int(0, i)
    ;[order[i], order[j]] = [order[j]!, order[i]!]
  }
  const firstPass = options.firstPass ?? order.length
  let armed = 0
  return () => {
    if (order.length === 0) return undefined
    const point = order[armed % order.length]!
    armed++
    return { point, rate: armed <= firstPass ? (options.firstRate ?? 0.1) : (options.laterRate ?? 0.02) }
  }
}
