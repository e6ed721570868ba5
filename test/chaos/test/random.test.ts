import { describe, expect, it } from 'vitest'
import { createRandom } from '../src/random.js'

const draw = (seed: number, n = 8) => {
  const random = createRandom(seed)
  return Array.from({ length: n }, () => random.next())
}

describe('createRandom', () => {
  it('produces the same sequence for the same seed and a different one for another seed', () => {
    expect(draw(42)).toEqual(draw(42))
    expect(draw(42)).not.toEqual(draw(43))
  })

  it('pins the mulberry32 sequence, so a seed printed by an old run still reproduces it', () => {
    const random = createRandom(1)
    expect([random.next(), random.next(), random.next()].map((x) => x.toFixed(8))).toEqual([
      '0.62707394',
      '0.00273572',
      '0.52744704',
    ])
  })

  it('forks independent streams that do not depend on draws made by the parent', () => {
    const a = createRandom(7)
    const b = createRandom(7)
    b.next()
    b.next()
    expect(a.fork('nemesis').next()).toBe(b.fork('nemesis').next())
    expect(a.fork('nemesis').next()).not.toBe(a.fork('generator').next())
  })

  it('draws integers in the inclusive range and covers both ends', () => {
    const random = createRandom(99)
    const seen = new Set<number>()
    for (let i = 0; i < 500; i++) {
      const n = random.int(3, 6)
      expect(n).toBeGreaterThanOrEqual(3)
      expect(n).toBeLessThanOrEqual(6)
      seen.add(n)
    }
    expect([...seen].sort()).toEqual([3, 4, 5, 6])
  })

  it('honours probabilities roughly, and the extremes exactly', () => {
    const random = createRandom(5)
    let hits = 0
    for (let i = 0; i < 2000; i++) if (random.chance(0.25)) hits++
    expect(hits).toBeGreaterThan(400)
    expect(hits).toBeLessThan(600)
    expect(random.chance(0)).toBe(false)
    expect(random.chance(1)).toBe(true)
  })

  it('rejects seeds that are not unsigned 32-bit integers, naming the option', () => {
    expect(() => createRandom(-1)).toThrow(/`seed`/)
    expect(() => createRandom(1.5)).toThrow(TypeError)
    expect(() => createRandom(2 ** 32)).toThrow(TypeError)
  })
})
