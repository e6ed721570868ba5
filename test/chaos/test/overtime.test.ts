import { describe, expect, it } from 'vitest'
import { overtime } from '../src/overtime.js'

describe('overtime', () => {
  it('ends as soon as every requested kind happened', async () => {
    const happened: Record<string, number> = { 'kill-db-connections': 1 }
    setTimeout(() => {
      happened['restart-pooler'] = 1
    }, 30)
    const lines: string[] = []
    const waited = await overtime({
      faults: ['kill-db-connections', 'restart-pooler'],
      happened: () => happened,
      maxMs: 10_000,
      pollMs: 5,
      log: (line) => lines.push(line),
    })
    expect(waited).toBeLessThan(10_000)
    expect(lines[0]).toContain('until restart-pooler happened')
    expect(lines[1]).not.toContain('still missing')
  })

  it('gives up after maxMs, naming what is still missing', async () => {
    const lines: string[] = []
    await overtime({
      faults: ['failover'],
      happened: () => ({}),
      maxMs: 20,
      pollMs: 5,
      log: (l) => lines.push(l),
    })
    expect(lines.at(-1)).toContain('still missing: failover')
  })

  it('does not wait when nothing is missing', async () => {
    const lines: string[] = []
    expect(
      await overtime({
        faults: ['delay'],
        happened: () => ({ delay: 2 }),
        maxMs: 1000,
        log: (l) => lines.push(l),
      }),
    ).toBe(0)
    expect(lines).toEqual([])
  })
})
