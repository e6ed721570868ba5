/**
 * A small seeded PRNG, so a run is a function of its seed.
 *
 * The generator is mulberry32 (32-bit state, passes BigCrush's gap tests well enough for picking faults). Each
 * component draws from its own stream, forked by label, so adding a draw to the nemesis does not shift the intents
 * the generator produces for the same seed.
 */

/** A deterministic source of randomness. */
export interface Random {
  /** The seed this stream was created from (after forking, the derived seed). */
  readonly seed: number
  /** A float in [0, 1). */
  next(): number
  /** An integer in [min, max], both inclusive. */
  int(min: number, max: number): number
  /** `true` with probability `p`. */
  chance(p: number): boolean
  /** One element of a non-empty array. */
  pick<T>(items: readonly T[]): T
  /** An independent stream whose sequence depends only on this stream's seed and `label`. */
  fork(label: string): Random
}

/** The largest seed accepted: seeds are unsigned 32-bit integers. */
export const MAX_SEED = 0xffff_ffff

/**
 * Creates a stream from an unsigned 32-bit seed.
 *
 * @example
 * const random = createRandom(42)
 * const nemesis = random.fork('nemesis')
 * nemesis.chance(0.1)
 */
export function createRandom(seed: number): Random {
  if (!Number.isInteger(seed) || seed < 0 || seed > MAX_SEED) {
    throw new TypeError(`Expected \`seed\` to be an integer in [0, ${MAX_SEED}], got ${seed}.`)
  }
  let state = seed >>> 0
  const next = (): number => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  return {
    seed,
    next,
    int(min, max) {
      if (!Number.isInteger(min) || !Number.isInteger(max) || max < min) {
        throw new RangeError(`Expected integers min <= max, got ${min} and ${max}.`)
      }
      return min + Math.floor(next() * (max - min + 1))
    },
    chance(p) {
      return next() < p
    },
    pick(items) {
      if (items.length === 0) throw new RangeError('Cannot pick from an empty array.')
      return items[Math.floor(next() * items.length)] as (typeof items)[number]
    },
    fork(label) {
      return createRandom(hashSeed(seed, label))
    },
  }
}

/** FNV-1a over the seed's bytes and the label, finished with a murmur3 mix so nearby labels diverge. */
function hashSeed(seed: number, label: string): number {
  let h = 0x811c9dc5
  const mix = (byte: number) => {
    h ^= byte & 0xff
    h = Math.imul(h, 0x01000193)
  }
  for (let i = 0; i < 4; i++) mix(seed >>> (i * 8))
  for (let i = 0; i < label.length; i++) {
    const c = label.charCodeAt(i)
    mix(c)
    mix(c >>> 8)
  }
  h ^= h >>> 16
  h = Math.imul(h, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

/** A fresh seed for a run that was not given one (the report prints it so the run can be reproduced). */
export function randomSeed(): number {
  return Math.floor(Math.random() * (MAX_SEED + 1))
}
