// The per-variant accounting table (suites accounting and cpu joined: what each request costs the database and both
// processes) and the adapters-and-datasources table (suite adapters, each against its own baseline), as Markdown
// and as the JSON summary's entries.
import { describeSpread, spreadOf } from './paired.js'
import { baselineOf } from './server/registry.js'
import { round } from './stats.js'
import type { AccountingRow } from './suites/accounting.js'
import type { ScenarioSummary } from './suites/compare.js'
import type { CpuSplit } from './suites/cpu.js'

export const table = (head: string[], rows: (string | number)[][]) =>
  [
    `| ${head.join(' | ')} |`,
    `| ${head.map(() => '---').join(' | ')} |`,
    ...rows.map((r) => `| ${r.join(' | ')} |`),
  ].join('\n')

/** One line per variant and path: the counted costs, with the CPU of the same path when suite cpu ran. */
export function accountingEntries(accounting: readonly AccountingRow[], cpu: readonly CpuSplit[]) {
  const keys = [
    ...new Set([
      ...accounting.map((a) => `${a.variant} ${a.path}`),
      ...cpu.map((c) => `${c.variant} ${c.path}`),
    ]),
  ]
  return keys.map((id) => {
    const [variant, path] = id.split(' ') as [string, 'first' | 'replay']
    const counted = accounting.find((a) => a.variant === variant && a.path === path)
    const used = cpu.find((c) => c.variant === variant && c.path === path)
    return {
      variant,
      path,
      roundTrips: counted ? round(counted.roundTrips, 2) : null,
      statements: counted ? round(counted.statements, 2) : null,
      bytesToPostgres: counted ? round(counted.bytesToPostgres, 0) : null,
      bytesFromPostgres: counted ? round(counted.bytesFromPostgres, 0) : null,
      walBytes: counted ? round(counted.walBytes, 0) : null,
      failures: counted?.failures ?? null,
      serverUs: used ? round(used.serverUs, 0) : null,
      backendUs: used ? round(used.backendUs, 0) : null,
      postgresUs: used ? round(used.postgresUs, 0) : null,
      writesPerRequest: used ? round(used.writesPerRequest, 2) : null,
    }
  })
}

const cell = (value: number | null) => (value === null ? 'n/a' : String(value))

export function accountingMarkdown(accounting: readonly AccountingRow[], cpu: readonly CpuSplit[]): string {
  const entries = accountingEntries(accounting, cpu)
  if (entries.length === 0) return ''
  const requests = accounting[0]?.requests
  return `\n**per-variant accounting, per request** (round trips, statements and bytes counted by a proxy between the server and Postgres, one request at a time, ${requests ?? 'n/a'} requests x rounds, median; WAL: least over rounds of the cluster's WAL advance; CPU from suite cpu at 10 connections, median, microseconds: the server process, the backends of the bench database, every postgres process)\n\n${table(
    [
      'variant',
      'path',
      'round trips',
      'statements',
      'bytes to Postgres',
      'bytes from Postgres',
      'WAL bytes',
      'server CPU us',
      'backend CPU us',
      'all postgres CPU us',
      'server writes',
    ],
    entries.map((e) => [
      e.variant,
      e.path,
      cell(e.roundTrips),
      cell(e.statements),
      cell(e.bytesToPostgres),
      cell(e.bytesFromPostgres),
      cell(e.walBytes),
      cell(e.serverUs),
      cell(e.backendUs),
      cell(e.postgresUs),
      cell(e.writesPerRequest),
    ]),
  )}`
}

export function adaptersEntries(adapters: readonly ScenarioSummary[], accounting: readonly AccountingRow[]) {
  const trips = (variant: string, path: string) =>
    accounting.find((a) => a.variant === variant && a.path === path)?.roundTrips ?? null
  return adapters.map((s) => {
    const rounds = spreadOf(s.ratios)!
    return {
      scenario: s.scenario.id,
      shape: s.shape,
      baseline: s.scenario.baseline,
      throughputRatio: round(rounds.median),
      ratioMin: round(rounds.min),
      ratioMax: round(rounds.max),
      ratios: rounds.values.map((r) => round(r)),
      rps: round(s.rps, 0),
      baselineRps: round(s.baselineRps, 0),
      addedP50Ms: round(s.addedP50Ms),
      roundTrips: trips(s.scenario.variant, s.scenario.path),
      baselineRoundTrips: trips(baselineOf(s.scenario.variant), 'first'),
      failures: s.failures,
      executionsPerRequest: round(s.executionsPerRequest),
    }
  })
}

export function adaptersMarkdown(
  adapters: readonly ScenarioSummary[],
  accounting: readonly AccountingRow[],
): string {
  if (adapters.length === 0) return ''
  const shapes = [...new Set(adapters.map((a) => a.shape))].join(', ')
  return `\n**adapters and datasources** (${shapes}; each against its own baseline: the same INSERT on the same framework and through the same library, no idempotency; ratio median of paired rounds, min–max)\n\n${table(
    [
      'scenario',
      'baseline',
      'req/s ratio',
      'req/s',
      'baseline req/s',
      'added p50 ms',
      'round trips',
      "baseline's round trips",
      'executions/request',
      'failures',
    ],
    adapters.map((s) => {
      const e = adaptersEntries([s], accounting)[0]!
      return [
        s.scenario.id,
        s.scenario.baseline,
        describeSpread(spreadOf(s.ratios)!),
        e.rps,
        e.baselineRps,
        s.addedP50Ms.toFixed(3),
        cell(e.roundTrips),
        cell(e.baselineRoundTrips),
        s.executionsPerRequest.toFixed(2),
        s.failures,
      ]
    }),
  )}`
}
