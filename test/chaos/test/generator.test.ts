import { canonicalJson } from '@oncely/protocol'
import { describe, expect, it } from 'vitest'
import { DECLINE_ABOVE, planIntents } from '../src/generator.js'
import { createRandom } from '../src/random.js'

const plan = (seed: number, intents = 400) =>
  planIntents(createRandom(seed).fork('generator'), { intents, workers: 3 })

describe('planIntents', () => {
  it('is a function of the seed', () => {
    expect(plan(11)).toEqual(plan(11))
    expect(plan(11)).not.toEqual(plan(12))
  })

  it('gives every normal intent its id as reference and its worker’s tenant', () => {
    const normal = plan(3).filter((i) => i.kind === 'normal')
    for (const intent of normal) {
      expect(intent.body.reference).toBe(intent.id)
      expect(intent.tenant).toBe(`tenant-${intent.worker + 1}`)
    }
  })

  it('makes changed-payload probes: same key and tenant, another amount, their own reference', () => {
    const intents = plan(5)
    const probes = intents.filter((i) => i.kind === 'changed-payload')
    expect(probes.length).toBeGreaterThan(5)
    for (const p of probes) {
      const original = intents.find((i) => i.id === p.of)!
      expect([p.tenant, p.worker]).toEqual([original.tenant, original.worker])
      expect(p.body.amount).not.toBe(original.body.amount)
      expect(p.body.reference).toBe(p.id)
    }
  })

  it('makes reordered probes whose body is canonically equal to the original but serialised differently', () => {
    const intents = plan(5)
    const probes = intents.filter((i) => i.kind === 'reordered')
    expect(probes.length).toBeGreaterThan(5)
    for (const p of probes) {
      const original = intents.find((i) => i.id === p.of)!
      expect(p.worker).toBe(original.worker)
      expect(canonicalJson(p.body)).toBe(canonicalJson(original.body))
      expect(JSON.stringify(p.body)).not.toBe(JSON.stringify(original.body))
    }
  })

  it('makes expired-replay probes: the original body exactly, of an original no probe touches before or after', () => {
    const intents = plan(5)
    const probes = intents.filter((i) => i.kind === 'expired-replay')
    expect(probes.length).toBeGreaterThan(3)
    for (const p of probes) {
      const original = intents.find((i) => i.id === p.of)!
      expect([p.tenant, p.worker]).toEqual([original.tenant, original.worker])
      expect(JSON.stringify(p.body)).toBe(JSON.stringify(original.body))
      expect(intents.filter((i) => i.of === original.id)).toEqual([p])
    }
  })

  it('makes one probe of each enabled kind early, whatever the seed', () => {
    for (let seed = 0; seed < 50; seed++) {
      const intents = planIntents(createRandom(seed), { intents: 10, workers: 2 })
      expect(intents.map((i) => i.kind)).toEqual(
        expect.arrayContaining(['changed-payload', 'reordered', 'expired-replay']),
      )
    }
    const none = planIntents(createRandom(1), {
      intents: 50,
      workers: 2,
      changedPayloadRate: 0,
      reorderedRate: 0,
      expiredReplayRate: 0,
    })
    expect(none.every((i) => i.kind === 'normal')).toBe(true)
  })

  it('includes declined amounts and spreads intents over workers and tenants', () => {
    const intents = plan(8)
    expect(intents.some((i) => i.body.amount > DECLINE_ABOVE)).toBe(true)
    expect(new Set(intents.map((i) => i.worker))).toEqual(new Set([0, 1, 2]))
    expect(new Set(intents.map((i) => i.tenant)).size).toBe(3)
  })
})
