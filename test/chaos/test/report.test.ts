import { describe, expect, it } from 'vitest'
import { check } from '../src/checker.js'
import { FAULT_KINDS, faultKindsOf } from '../src/faults.js'
import type { HistoryEvent } from '../src/history.js'
import { parseOptions, reproduceCommand } from '../src/options.js'
import { buildReport, exitCode, formatSummary } from '../src/report.js'

const ROOT = '/tmp/chaos-root'
const NOW = new Date('2026-01-02T03:04:05.000Z')

describe('parseOptions', () => {
  it('applies tier defaults and a run directory named after the time and seed', () => {
    const options = parseOptions(['--seed', '42'], ROOT, NOW)
    expect(options).toMatchObject({
      seed: 42,
      tier: 'quick',
      intents: 200,
      durationMs: 60_000,
      idempotency: true,
      fencing: true,
      backstop: true,
      retentionMs: 45_000,
      reservation: 'lock',
      replication: 'sync',
      pooler: 'none',
      replayCache: true,
      servers: 2,
      workers: 3,
      runDir: '/tmp/chaos-root/runs/2026-01-02T03-04-05-000Z-seed-42',
    })
    expect(options.faults).toEqual([...FAULT_KINDS])
    expect(options.report).toBe(`${options.runDir}/report.json`)
    expect(parseOptions(['--tier', 'long', '--seed', '1'], ROOT).intents).toBe(5000)
  })

  it('parses every option', () => {
    const options = parseOptions(
      [
        '--seed=7',
        '--intents=50',
        '--duration=2m',
        '--faults=drop-response,pause-server',
        '--report=/tmp/r.json',
      ],
      ROOT,
    )
    expect(options).toMatchObject({
      seed: 7,
      intents: 50,
      durationMs: 120_000,
      faults: ['drop-response', 'pause-server'],
      report: '/tmp/r.json',
    })
    expect(parseOptions(['--idempotency', 'off', '--fencing', 'off', '--seed', '1'], ROOT)).toMatchObject({
      idempotency: false,
      fencing: false,
      reservation: 'lock',
    })
    expect(parseOptions(['--backstop', 'off', '--retention', '10s', '--seed', '1'], ROOT)).toMatchObject({
      backstop: false,
      retentionMs: 10_000,
    })
    expect(parseOptions(['--faults', 'none', '--seed', '1'], ROOT).faults).toEqual([])
    expect(parseOptions(['--replication', 'async', '--pooler', 'pgbouncer'], ROOT)).toMatchObject({
      replication: 'async',
      pooler: 'pgbouncer',
      database: 'postgres',
    })
    // On Citus every kind but a single server's restart and failover, and the workers' faults.
    const citus = parseOptions(['--database', 'citus', '--seed', '1'], ROOT)
    expect(citus.faults).toEqual(faultKindsOf('citus'))
    expect(citus.faults).toContain('restart-worker')
    expect(citus.faults).toContain('kill-worker-connections')
    expect(citus.faults).not.toContain('restart-db')
    expect(citus.faults).not.toContain('failover')
    expect(reproduceCommand(citus)).toContain('--database citus')
    expect(reproduceCommand(citus)).not.toContain('--faults')
    // Through PgBouncer, the pooler's restart too, early in the first pass (before the long faults).
    const pooled = parseOptions(['--pooler', 'pgbouncer', '--seed', '1'], ROOT)
    expect(pooled.faults).toEqual(faultKindsOf('postgres', 'pgbouncer'))
    expect(pooled.faults.indexOf('restart-pooler')).toBe(pooled.faults.indexOf('kill-db-connections') + 1)
    expect(pooled.faults.indexOf('restart-pooler')).toBeLessThan(pooled.faults.indexOf('failover'))
    expect(parseOptions(['--seed', '1'], ROOT).faults).not.toContain('restart-pooler')
    expect(reproduceCommand(pooled)).not.toContain('--faults')
  })

  it('rejects bad values, naming the option', () => {
    expect(() => parseOptions(['--seed=-3'], ROOT)).toThrow(/`--seed`/)
    expect(() => parseOptions(['--seed', String(2 ** 32)], ROOT)).toThrow(/`--seed`/)
    expect(() => parseOptions(['--tier', 'medium'], ROOT)).toThrow(/`--tier`/)
    expect(() => parseOptions(['--duration', 'soon'], ROOT)).toThrow(/`--duration`/)
    expect(() => parseOptions(['--faults', 'drop-response,meteor'], ROOT)).toThrow(/Unknown fault `meteor`/)
    expect(() => parseOptions(['--database', 'mysql'], ROOT)).toThrow(/`--database` to be postgres or citus/)
    expect(() => parseOptions(['--database', 'citus', '--faults', 'failover'], ROOT)).toThrow(
      /names failover, which cannot happen with `--database citus`/,
    )
    expect(() => parseOptions(['--faults', 'restart-worker'], ROOT)).toThrow(
      /names restart-worker, which cannot happen with `--database postgres`/,
    )
    expect(() => parseOptions(['--faults', 'restart-pooler'], ROOT)).toThrow(
      /names restart-pooler, which cannot happen with `--database postgres` and `--pooler none`/,
    )
    expect(() => parseOptions(['--idempotency', 'no'], ROOT)).toThrow(/`--idempotency`/)
    expect(() => parseOptions(['--servers', '1'], ROOT)).toThrow(/`--servers`/)
    expect(() => parseOptions(['--backstop', 'no'], ROOT)).toThrow(/`--backstop`/)
    expect(() => parseOptions(['--retention', '2s'], ROOT)).toThrow(/`--retention` to be at least 5s/)
    expect(() => parseOptions(['--replication', 'semi'], ROOT)).toThrow(/`--replication` to be sync or async/)
    expect(() => parseOptions(['--pooler', 'pgpool'], ROOT)).toThrow(/`--pooler` to be none or pgbouncer/)
    expect(() => parseOptions(['--colour'], ROOT)).toThrow()
  })

  it('prints a reproduce command that parses back to the same configuration', () => {
    const options = parseOptions(
      [
        '--seed',
        '99',
        '--intents',
        '30',
        '--duration',
        '45s',
        '--faults',
        'delay,restart-db',
        '--fencing',
        'off',
        '--backstop',
        'off',
        '--retention',
        '20s',
        '--replication',
        'async',
        '--pooler',
        'pgbouncer',
      ],
      ROOT,
      NOW,
    )
    const command = reproduceCommand(options)
    expect(command).toBe(
      'pnpm chaos --seed 99 --tier quick --intents 30 --duration 45s --servers 2 --workers 3 --faults delay,restart-db --fencing off --backstop off --retention 20s --replication async --pooler pgbouncer',
    )
    const again = parseOptions(command.split(' ').slice(2), ROOT, NOW)
    expect(again).toEqual(options)
    const none = parseOptions(['--seed', '1', '--faults', 'none'], ROOT, NOW)
    expect(reproduceCommand(none)).toMatch(/ --faults none$/)
    expect(parseOptions(reproduceCommand(none).split(' ').slice(2), ROOT, NOW)).toEqual(none)
  })
})

describe('report', () => {
  const history: HistoryEvent[] = [
    {
      index: 1,
      time: 1,
      process: 'worker-1',
      type: 'intent',
      phase: 'invoke',
      intent: 'i1',
      tenant: 't1',
      key: 'k1',
      kind: 'normal',
      body: { amount: 5, currency: 'eur', reference: 'i1' },
    },
    {
      index: 2,
      time: 2,
      process: 'worker-1',
      type: 'intent',
      phase: 'ok',
      intent: 'i1',
      tenant: 't1',
      key: 'k1',
      response: {
        status: 201,
        body: { id: 'p1', amount: 5, currency: 'eur', reference: 'i1', status: 'succeeded', chargeId: null },
      },
    },
  ]
  const options = parseOptions(
    ['--seed', '5', '--faults', 'drop-response,delay', '--run-dir', '/tmp/run'],
    ROOT,
  )

  it('cites the history lines of each violation in full, counts outcomes and faults, and lists missing faults', () => {
    const result = check(history, { payments: [], charges: [], keys: [], outbox: [] })
    const report = buildReport({
      options,
      result,
      history,
      historyFile: '/tmp/run/history.jsonl',
      faults: { 'drop-response': 4 },
      startedAt: NOW,
      finishedAt: new Date(NOW.getTime() + 1500),
    })
    expect(report).toMatchObject({
      seed: 5,
      intents: 1,
      durationMs: 1500,
      valid: false,
      missingFaults: ['delay'],
      outcomes: { lost: 1, ok: 0 },
    })
    expect(report.violations[0]).toMatchObject({ rule: 'lost-acknowledged', lines: [1, 2], events: history })
    expect(exitCode(report)).toBe(1)
    const summary = formatSummary(report)
    expect(summary).toContain('FAIL: 1 violation(s)')
    expect(summary).toContain('lost-acknowledged (intent i1, key k1)')
    expect(summary).toContain('history lines 1, 2')
    expect(summary).toContain('never happened: delay')
    expect(summary).toContain('reproduce: pnpm chaos --seed 5')
  })

  it('exits 0 only when valid and every requested fault happened, 3 when a fault never happened', () => {
    const result = check(history, {
      payments: [{ id: 'p1', tenantId: 't1', amount: 5, currency: 'eur', reference: 'i1', chargeId: null }],
      charges: [],
      keys: [],
      outbox: [{ id: 'o1', paymentId: 'p1' }],
    })
    const base = { options, result, history, historyFile: 'h', startedAt: NOW, finishedAt: NOW }
    expect(result.valid).toBe(true)
    expect(exitCode(buildReport({ ...base, faults: { 'drop-response': 1, delay: 2 } }))).toBe(0)
    expect(exitCode(buildReport({ ...base, faults: { 'drop-response': 1 } }))).toBe(3)
    expect(formatSummary(buildReport({ ...base, faults: { 'drop-response': 1, delay: 2 } }))).toContain(
      'PASS: no violations',
    )
  })
})
