import { TEST_CARDS } from '@oncely/payments-api/src/provider.ts'
import { canonicalJson } from '@oncely/protocol'
import { describe, expect, it } from 'vitest'
import { BURST_TENANT, DECLINE_ABOVE, planBurst, planIntents } from '../src/generator.js'
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

  it('makes expired-changed-payload probes: another amount, their own reference, of an original no probe touches before or after', () => {
    const intents = plan(5, 2_000)
    const probes = intents.filter((i) => i.kind === 'expired-changed-payload')
    expect(probes.length).toBeGreaterThan(3)
    for (const p of probes) {
      const original = intents.find((i) => i.id === p.of)!
      expect([p.tenant, p.worker]).toEqual([original.tenant, original.worker])
      expect(p.body.amount).not.toBe(original.body.amount)
      expect(p.body.reference).toBe(p.id)
      expect(intents.filter((i) => i.of === original.id)).toEqual([p])
    }
  })

  it('makes one probe of each enabled kind early, whatever the seed', () => {
    for (let seed = 0; seed < 50; seed++) {
      const intents = planIntents(createRandom(seed), { intents: 10, workers: 2 })
      expect(intents.map((i) => i.kind)).toEqual(
        expect.arrayContaining(['changed-payload', 'reordered', 'expired-replay', 'expired-changed-payload']),
      )
    }
    const none = planIntents(createRandom(1), {
      intents: 50,
      workers: 2,
      changedPayloadRate: 0,
      reorderedRate: 0,
      expiredReplayRate: 0,
      expiredChangedPayloadRate: 0,
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

describe('planBurst', () => {
  const burst = (seed: number, round = 1, size = 20) =>
    planBurst(createRandom(seed).fork('bursts'), { round, size })

  it('is a function of the seed, with fresh ids per round', () => {
    expect(burst(4)).toEqual(burst(4))
    expect(burst(4)).not.toEqual(burst(5))
    const ids = [...burst(4, 1), ...burst(4, 2)].map((i) => i.id)
    expect(new Set(ids).size).toBe(40)
  })

  it('mixes the failure paths, each with its provider test card, mostly declines; each its own reference', () => {
    const intents = burst(9)
    const count = (flavor: string) => intents.filter((i) => i.flavor === flavor).length
    expect([count('declined'), count('slow'), count('processing-error'), count('plain')]).toEqual([
      8, 4, 4, 4,
    ])
    const cards: Record<string, string> = {
      declined: TEST_CARDS.declined,
      slow: TEST_CARDS.slow,
      'processing-error': TEST_CARDS.processingError,
    }
    for (const intent of intents) {
      expect(intent).toMatchObject({ kind: 'saturation', tenant: BURST_TENANT, worker: -1 })
      expect(intent.body.reference).toBe(intent.id)
      if (intent.flavor !== 'plain') expect(intent.body.card).toBe(cards[intent.flavor])
      else expect(Object.values(TEST_CARDS)).not.toContain(intent.body.card)
      // Not the amounts the provider declines on their own: a decline here is the card's, thrown.
      expect(intent.body.amount).toBeLessThanOrEqual(DECLINE_ABOVE)
    }
  })
})
