/**
 * The suite must prove it can fail: runs against the demo with its idempotency layer or its fencing switched off
 * have to end in violations. Real runs (API processes, workers, proxies, Postgres), kept small.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { parseOptions } from '../src/options.js'
import { run } from '../src/run.js'

const dir = mkdtempSync(join(tmpdir(), 'oncely-chaos-sabotage-'))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

describe('a sabotaged demo', () => {
  it('is caught with idempotency off: lost responses become duplicate payments and charges', async () => {
    const options = parseOptions(
      [
        '--seed=7',
        '--intents=24',
        '--duration=10s',
        '--workers=2',
        '--faults=drop-response,duplicate',
        '--idempotency=off',
        `--run-dir=${join(dir, 'idempotency-off')}`,
      ],
      dir,
    )
    const report = await run(options, () => {})
    expect(report.valid).toBe(false)
    expect(report.faults['drop-response']).toBeGreaterThan(0)
    const rules = new Set(report.violations.map((v) => v.rule))
    expect(rules).toContain('duplicate-payment')
    expect(report.outcomes.duplicated).toBeGreaterThan(0)
    // Every violation cites the history lines that show it.
    const duplicate = report.violations.find((v) => v.rule === 'duplicate-payment')!
    expect(duplicate.events.length).toBeGreaterThan(0)
    expect(duplicate.rows?.length).toBeGreaterThan(1)
  }, 300_000)

  it('is caught with fencing off: a handler stalled past its lease completes after its successor', async () => {
    const options = parseOptions(
      [
        '--seed=4',
        '--intents=60',
        '--duration=30s',
        '--faults=stall-server',
        '--fencing=off',
        `--run-dir=${join(dir, 'fencing-off')}`,
      ],
      dir,
    )
    const report = await run(options, () => {})
    expect(report.faults['stall-server']).toBeGreaterThan(0)
    expect(report.valid).toBe(false)
    expect(report.violations.map((v) => v.rule)).toEqual(expect.arrayContaining(['duplicate-payment']))
  }, 300_000)
})
