import { describe, expect, it } from 'vitest'
import { createRandom } from '../src/random.js'
import { crashRotation } from '../src/rotation.js'

describe('crashRotation', () => {
  const points = ['after-reserve', 'after-provider', 'after-commit']

  it('arms every point once per pass, in a seeded order, high rate first then low', () => {
    const next = crashRotation(createRandom(3), points, { firstPass: 3, firstRate: 0.5, laterRate: 0.01 })
    const first = [next(), next(), next()]
    expect(first.map((a) => a?.point).sort()).toEqual([...points].sort())
    expect(first.every((a) => a?.rate === 0.5)).toBe(true)
    expect(next()).toEqual({ point: first[0]!.point, rate: 0.01 })
  })

  it('is reproducible from the seed', () => {
    const run = (seed: number) => {
      const next = crashRotation(createRandom(seed), points)
      return Array.from({ length: 6 }, () => next()?.point)
    }
    expect(run(9)).toEqual(run(9))
  })

  it('arms nothing when no point is enabled', () => {
    expect(crashRotation(createRandom(1), [])()).toBeUndefined()
  })
})
