import { describe, expect, it } from 'vitest'
import { nextProbeDelay, PROBE_BUDGET_MS } from '../src/probe-budget.js'

describe('the probe budget', () => {
  it('keeps retrying instant failures (a refused connection) until the time budget, not for eight attempts', () => {
    // Eight refused connections in a row take 3.6 s of pauses: a crashed instance is still restarting then.
    let elapsed = 0
    let attempt = 1
    for (; attempt <= 8; attempt++) elapsed += nextProbeDelay(attempt, elapsed)!
    expect(elapsed).toBe(3_600)
    expect(nextProbeDelay(attempt, elapsed)).toBe(900)
  })

  it('stops once the next pause would pass the budget, with pauses capped at 1 s', () => {
    expect(nextProbeDelay(50, 5_000)).toBe(1_000)
    expect(nextProbeDelay(50, PROBE_BUDGET_MS - 1_000)).toBe(1_000)
    expect(nextProbeDelay(50, PROBE_BUDGET_MS - 999)).toBeUndefined()
  })
})
