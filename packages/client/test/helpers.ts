import { vi } from 'vitest'

/** Advances fake time in steps until `promise` settles; returns its outcome without throwing. */
export async function runToEnd<T>(
  promise: Promise<T>,
  stepMs = 100,
): Promise<{ ok: true; value: T } | { ok: false; error: unknown }> {
  let outcome: { ok: true; value: T } | { ok: false; error: unknown } | undefined
  promise.then(
    (value) => {
      outcome = { ok: true, value }
    },
    (error) => {
      outcome = { ok: false, error }
    },
  )
  for (let i = 0; i < 100_000 && !outcome; i++) await vi.advanceTimersByTimeAsync(stepMs)
  if (!outcome) throw new Error('promise did not settle')
  return outcome
}

/** The error of a rejected outcome, failing the test if it resolved. */
export function errorOf(outcome: { ok: true; value: unknown } | { ok: false; error: unknown }): unknown {
  if (outcome.ok) throw new Error(`expected a rejection, got ${JSON.stringify(outcome.value)}`)
  return outcome.error
}
