// The inbox's payload fingerprint: equal values are one message whatever their member order, bytes and strings are
// compared exactly, and a mismatch is never silent. Property-based over random JSON values, then against Postgres.
import type { TestDatabase } from '@oncely/test-support'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { payloadFingerprint } from '../../src/inbox/inbox.js'
import { createInbox, describeInboxEvent, type InboxEvent } from '../../src/inbox/index.js'
import { engineFor, freshKey, setupDatabase } from '../helpers.js'

/** JSON values a payload can hold exactly: finite numbers, integers within 2^53, any Unicode strings and names. */
const jsonValue = fc.letrec<{ value: unknown }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constant(null),
    fc.boolean(),
    fc.maxSafeInteger(),
    fc
      .double({ noNaN: true, noDefaultInfinity: true })
      .filter((n) => !Number.isInteger(n) || Number.isSafeInteger(n)),
    fc.string({ unit: 'grapheme' }),
    fc.array(tie('value'), { maxLength: 5 }),
    fc.dictionary(fc.string({ unit: 'grapheme', maxLength: 6 }), tie('value'), { maxKeys: 6 }),
  ),
})).value

/** The same value with the members of every object inserted in another order (seeded permutations). */
function reorder(value: unknown, seed: number): unknown {
  if (Array.isArray(value)) return value.map((item, i) => reorder(item, seed + i + 1))
  if (typeof value !== 'object' || value === null) return value
  const entries = Object.entries(value)
  let state = seed >>> 0 || 1
  for (let i = entries.length - 1; i > 0; i--) {
    state = (Math.imul(state, 1_103_515_245) + 12_345) >>> 0
    const j = state % (i + 1)
    ;[entries[i], entries[j]] = [entries[j] as [string, unknown], entries[i] as [string, unknown]]
  }
  const out: Record<string, unknown> = {}
  for (const [name, member] of entries) {
    Object.defineProperty(out, name, {
      value: reorder(member, seed + name.length),
      enumerable: true,
      writable: true,
      configurable: true,
    })
  }
  return out
}

describe('payloadFingerprint', () => {
  it('is the same for a value and any reordering of its members', () => {
    fc.assert(
      fc.property(jsonValue, fc.integer(), (value, seed) => {
        expect(payloadFingerprint(reorder(value, seed) as object)).toBe(payloadFingerprint(value as object))
      }),
      { numRuns: 500 },
    )
  })

  it('differs for values that differ', () => {
    fc.assert(
      fc.property(jsonValue, jsonValue, (a, b) => {
        fc.pre(JSON.stringify(reorder(a, 1)) !== JSON.stringify(reorder(b, 1)))
        expect(payloadFingerprint(a as object)).not.toBe(payloadFingerprint(b as object))
      }),
      { numRuns: 500 },
    )
  })

  it('compares bytes and strings exactly: whitespace or member order in text is another payload', () => {
    fc.assert(
      fc.property(fc.uint8Array({ minLength: 1, maxLength: 64 }), fc.nat(63), (bytes, at) => {
        const changed = Uint8Array.from(bytes)
        const i = at % changed.length
        changed[i] = ((changed[i] as number) + 1) % 256
        expect(payloadFingerprint(changed)).not.toBe(payloadFingerprint(bytes))
        expect(payloadFingerprint(Buffer.from(bytes))).toBe(payloadFingerprint(bytes))
        expect(payloadFingerprint(bytes.buffer.slice(0))).toBe(payloadFingerprint(bytes))
      }),
    )
    expect(payloadFingerprint('{"b":2,"a":1}')).not.toBe(payloadFingerprint('{"a":1,"b":2}'))
    expect(payloadFingerprint('{"a":1, "b":2}')).not.toBe(payloadFingerprint('{"a":1,"b":2}'))
    // Canonical JSON text hashes like the value it encodes, so a consumer may pass either.
    expect(payloadFingerprint('{"a":1,"b":2}')).toBe(payloadFingerprint({ b: 2, a: 1 }))
  })

  it('refuses, naming `payload`, a string with a lone surrogate (UTF-8 would hash it as U+FFFD, like another text)', () => {
    for (const bad of ['a\ud800', '\udc00', 'x\udc00\ud800']) {
      expect(() => payloadFingerprint(bad)).toThrow(TypeError)
      expect(() => payloadFingerprint(bad)).toThrow(/`payload`.*lone surrogate.*bytes/)
    }
    expect(payloadFingerprint('a\ufffd')).toMatch(/^[0-9a-f]{64}$/)
    expect(payloadFingerprint('\u{1F600}')).toBe(payloadFingerprint(Buffer.from('\u{1F600}')))
  })

  it('refuses, naming `payload`, a value JSON cannot hold exactly', () => {
    for (const bad of [{ n: Number.NaN }, { n: 2 ** 60 }, { n: 10n }, { note: '\ud800' }, { '\udc00': 1 }]) {
      expect(() => payloadFingerprint(bad)).toThrow(TypeError)
      expect(() => payloadFingerprint(bad)).toThrow(/Expected `payload` to be a JSON value.*bytes/)
    }
    // A lone surrogate has no canonical form (I-JSON): before, it was escaped as is into the hashed text.
    expect(() => payloadFingerprint({ note: 'a\ud800' })).toThrow(/Lone surrogate/)
  })
})

describe('inbox fingerprints', () => {
  let db: TestDatabase
  beforeAll(async () => {
    db = await setupDatabase('inbox_fingerprint')
    await db.pool.query('CREATE TABLE effects (id text NOT NULL)')
  })
  afterAll(() => db?.drop())

  const effects = async (id: string) =>
    (await db.pool.query('SELECT count(*)::int AS n FROM effects WHERE id = $1', [id])).rows[0].n as number

  it('a message redelivered with its members in another order is a duplicate, not a mismatch', async () => {
    const { engine } = engineFor(db.pool)
    const events: InboxEvent[] = []
    const inbox = createInbox({ engine, consumer: 'billing', onEvent: (event) => events.push(event) })
    const messageId = freshKey('m1')
    const handler = async ({ tx }: { tx: import('pg').PoolClient }) => {
      await tx.query('INSERT INTO effects VALUES ($1)', [messageId])
      return 'applied'
    }
    expect(await inbox.consume({ messageId, payload: { a: 1, b: 2 }, handler })).toEqual({
      kind: 'processed',
      result: 'applied',
    })
    expect(await inbox.consume({ messageId, payload: { b: 2, a: 1 }, handler })).toEqual({
      kind: 'duplicate',
      result: 'applied',
    })
    expect(await effects(messageId)).toBe(1)
    expect(events).toEqual([])
  })

  it('random payloads redelivered reordered are one message; a changed one is a reported mismatch', async () => {
    const { engine } = engineFor(db.pool)
    const events: InboxEvent[] = []
    const inbox = createInbox({ engine, consumer: 'property', onEvent: (event) => events.push(event) })
    await fc.assert(
      fc.asyncProperty(jsonValue, fc.integer(), async (value, seed) => {
        const payload = { value }
        const messageId = freshKey('prop')
        const handler = async ({ tx }: { tx: import('pg').PoolClient }) => {
          await tx.query('INSERT INTO effects VALUES ($1)', [messageId])
        }
        expect((await inbox.consume({ messageId, payload, handler })).kind).toBe('processed')
        const again = await inbox.consume({ messageId, payload: reorder(payload, seed) as object, handler })
        expect(again.kind).toBe('duplicate')
        const changed = await inbox.consume({ messageId, payload: { value, changed: true }, handler })
        expect(changed.kind).toBe('mismatch')
        expect(events.at(-1)).toEqual({ type: 'mismatch', consumer: 'property', topic: 'message', messageId })
        expect(await effects(messageId)).toBe(1)
      }),
      { numRuns: 40 },
    )
  })

  it('without onEvent, a mismatch is written once to console.error with what to do', async () => {
    const { engine } = engineFor(db.pool)
    const inbox = createInbox({ engine, consumer: 'silent-by-mistake' })
    const messageId = freshKey('m')
    const handler = async () => null
    await inbox.consume({ messageId, topic: 'orders.created', payload: { amount: 1 }, handler })
    const spy = vi.spyOn(console, 'error').mockImplementation(() => {})
    try {
      const result = await inbox.consume({
        messageId,
        topic: 'orders.created',
        payload: { amount: 2 },
        handler,
      })
      expect(result).toEqual({ kind: 'mismatch' })
      expect(spy).toHaveBeenCalledTimes(1)
      const line = String(spy.mock.calls[0]?.[0])
      expect(line).toBe(
        describeInboxEvent({
          type: 'mismatch',
          consumer: 'silent-by-mistake',
          topic: 'orders.created',
          messageId,
        }),
      )
      expect(line).toContain(messageId)
      expect(line).toContain('delete the record')
    } finally {
      spy.mockRestore()
    }
  })

  it('validates onEvent', () => {
    const { engine } = engineFor(db.pool)
    expect(() => createInbox({ engine, consumer: 'c', onEvent: 'log' as never })).toThrow(
      'Expected `onEvent` to be a function.',
    )
  })
})
