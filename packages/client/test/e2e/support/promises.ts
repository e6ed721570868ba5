// The promises of a durable intent store after a crash, shared by the crash tests of fileStore and indexedDbStore.
// A crashed caller reports facts as it goes (an intent written ahead, an answer, a discard, a rejection); what the
// store holds afterwards must agree with them.
import { expect } from 'vitest'

/** One thing the crashed caller had been told: `{ ack, key }`, `{ answered, key }`, `{ discarded }`, `{ rejected, name }`. */
export type Fact = Record<string, string | number | boolean>

/**
 * Checks `records` (what a new store finds after the crash) against `facts`: an acknowledged intent is kept unless
 * it was answered, discarded, or the server gave its final answer (`final` keys: the crashed caller may have
 * recorded it); an answered intent is never pending; a discarded intent and a write-ahead reported as failed are gone.
 */
export function expectPromisesKept(
  facts: readonly Fact[],
  records: ReadonlyMap<string, { state: string }>,
  final: ReadonlySet<string>,
  where: string,
): void {
  const done = (id: string) => facts.some((f) => f.answered === id || f.discarded === id)
  for (const fact of facts) {
    if (typeof fact.ack === 'string' && !done(fact.ack)) {
      const kept = records.has(fact.ack) || final.has(String(fact.key))
      expect(kept, `${where}: acknowledged intent ${fact.ack} lost`).toBe(true)
    }
    if (typeof fact.answered === 'string') {
      const state = records.get(fact.answered)?.state ?? 'absent'
      expect(state, `${where}: answered intent ${fact.answered}`).not.toBe('pending')
    }
    if (typeof fact.discarded === 'string') {
      expect(records.has(fact.discarded), `${where}: discarded intent ${fact.discarded} came back`).toBe(
        false,
      )
    }
    if (typeof fact.rejected === 'string' && /Storage|Quota/.test(String(fact.name))) {
      expect(records.has(fact.rejected), `${where}: failed write-ahead ${fact.rejected} came back`).toBe(
        false,
      )
    }
  }
}

/** Checks that nothing answered or discarded before the crash was among the keys sent (`sent`) after it. */
export function expectNothingResent(facts: readonly Fact[], sent: ReadonlySet<string>, where: string): void {
  const keyOf = new Map(facts.filter((f) => f.key).map((f) => [String(f.ack ?? f.answered), String(f.key)]))
  for (const fact of facts) {
    const id = fact.answered ?? fact.discarded
    if (typeof id !== 'string') continue
    const key = keyOf.get(id) ?? id // a one-off intent's id is its key
    expect(sent.has(key), `${where}: ${id} was sent again after its answer or discard`).toBe(false)
  }
}
