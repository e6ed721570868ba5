// Renders a run as Markdown tables (printed, and pasted into docs/benchmarks.md) and as the --json summary.
import type { MachineInfo } from './machine.js'
import { describeSpread, spreadOf } from './paired.js'
import {
  accountingEntries,
  accountingMarkdown,
  adaptersEntries,
  adaptersMarkdown,
  table,
} from './report-accounting.js'
import { round } from './stats.js'
import type { AccountingRow } from './suites/accounting.js'
import type { ClientSummary } from './suites/client.js'
import type { HeadToHead, ScenarioSummary } from './suites/compare.js'
import type { CpuSplit } from './suites/cpu.js'
import type { InstancesResult } from './suites/instances.js'
import type { OtelCost } from './suites/otel.js'
import type { ReaperResult, ResumeResult } from './suites/scale.js'
import type { StormResult } from './suites/storm.js'
import type { Target } from './targets.js'

export interface BenchReport {
  mode: 'quick' | 'full'
  startedAt: string
  machine: MachineInfo
  rounds: number
  failedVariants: Record<string, string>
  server: ScenarioSummary[]
  /** Two variants' first executions run against each other, pair after pair (see `headToHead`). */
  headToHead: HeadToHead[]
  storm: StormResult[]
  client: ClientSummary[]
  reaper: ReaperResult | undefined
  resume: ResumeResult[]
  /** oncely measured again with the key table filled to 1M and 10M rows (shapes named `c1@1M` and so on). */
  scale: ScenarioSummary[]
  /** CPU per request by process, first execution and replay (suite `cpu`). */
  cpu: CpuSplit[]
  /** Round trips, statements, bytes and WAL per request (suite `accounting`). */
  accounting: AccountingRow[]
  /** The other HTTP adapters, a recovery point and the database libraries against their baselines (suite `adapters`). */
  adapters: ScenarioSummary[]
  /** @oncely/server/otel against the bare engine (suite `otel`). */
  otel: OtelCost[]
  /** Payments API instances sharing one Postgres, the key table's size and the reaper (suite `instances`). */
  instances: InstancesResult | undefined
  targets: Target[]
}

const ms = (value: number) => (Number.isFinite(value) ? value.toFixed(3) : 'n/a')
const percent = (share: number) => `${(share * 100).toFixed(0)}%`
/** Bytes as MiB or GiB, for sizes from a table's rows. */
const size = (bytes: number) =>
  bytes >= 2 ** 30 ? `${(bytes / 2 ** 30).toFixed(1)} GiB` : `${(bytes / 2 ** 20).toFixed(0)} MiB`

function instancesMarkdown(result: InstancesResult): string {
  const first = result.runs[0]
  const runs = table(
    [
      'instances',
      'workload',
      'req/s',
      'req/s per round',
      'p50 ms',
      'p99 ms',
      'statuses',
      'payments per fresh key',
      'machine CPU busy',
      'iowait',
      'load avg (1 min, end)',
      'CPU us/request: instances',
      'Postgres',
      'load generator',
      'commits/request',
      'WAL syncs/request (server-wide)',
      'WAL bytes/request (server-wide)',
    ],
    result.runs.map((r) => [
      r.instances,
      r.workload,
      r.rps.toFixed(0),
      r.rpsRounds.map((rps) => rps.toFixed(0)).join(', '),
      ms(r.p50Ms),
      ms(r.p99Ms),
      Object.entries(r.statuses)
        .map(([code, n]) => `${code}: ${n}`)
        .join(', ') + (r.errors ? `, errors: ${r.errors}` : ''),
      r.paymentsPerFreshKey.toFixed(2),
      percent(r.machineBusy),
      percent(r.machineIowait),
      r.loadAverage.toFixed(2),
      r.instancesUs.toFixed(0),
      r.postgresUs.toFixed(0),
      r.loadUs.toFixed(0),
      r.commitsPerRequest.toFixed(2),
      r.walSyncsPerRequest.toFixed(2),
      r.walBytesPerRequest.toFixed(0),
    ]),
  )
  const k = result.keyTable
  const bytes = (b: KeyBytes) => `${b.total} (heap ${b.heap}, indexes ${b.indexes}, TOAST ${b.toast})`
  const keyTable = table(
    ['measure', 'value'],
    [
      ['key rows written by the runs', k.rows],
      ['bytes per key row as written', bytes(k.asWritten)],
      ['bytes per key row after VACUUM FULL', bytes(k.compacted)],
      ['peak first-execution rate measured', `${k.peakInsertRps.toFixed(0)} keys/s`],
      ['keys per day at that rate', Math.round(k.keysPerDay).toLocaleString('en-US')],
      [
        `key table at the default retention (${k.retentionHours} h)`,
        `${size(k.bytesAtRetention.compacted)} compacted, ${size(k.bytesAtRetention.asWritten)} as written`,
      ],
      [
        'reaper (engine.reap())',
        `${k.reaper.expiredRows} expired keys in ${k.reaper.seconds.toFixed(2)} s: ${k.reaper.rowsPerSecond.toFixed(0)} rows/s, batches of ${k.reaper.batchSize}`,
      ],
      ['reaper rate / peak insert rate', `${(k.reaper.rowsPerSecond / k.peakInsertRps).toFixed(0)}x`],
    ],
  )
  return `\n**instances** (payments API processes on one Postgres, \`POST /v1/payments\`, ${first?.connections ?? 0} connections dealt round-robin over the instances, ${first?.requests ?? 0} requests per run, reservation: '${result.reservation}'; median of ${result.rounds} rounds, statuses summed)\n\n${runs}\n\n**key table and reaper**\n\n${keyTable}`
}

type KeyBytes = InstancesResult['keyTable']['asWritten']

/** A run's report before any suite has added to it. */
export function emptyReport(
  run: Pick<BenchReport, 'mode' | 'startedAt' | 'machine' | 'rounds'>,
): BenchReport {
  return {
    ...run,
    failedVariants: {},
    server: [],
    headToHead: [],
    storm: [],
    client: [],
    reaper: undefined,
    resume: [],
    scale: [],
    cpu: [],
    accounting: [],
    adapters: [],
    otel: [],
    instances: undefined,
    targets: [],
  }
}

export function markdown(report: BenchReport): string {
  const m = report.machine
  const parts = [
    `Run ${report.startedAt}, ${report.mode} mode, ${report.rounds} rounds. ${m.cpu}, ${m.cores} cores, ${m.memoryGiB} GiB, Node ${m.node}, PostgreSQL ${m.postgres}, synchronous_commit=${m.synchronousCommit}, load average ${m.loadAverage} at start.`,
  ]
  const all = [...report.server, ...report.scale]
  for (const shape of [...new Set(all.map((s) => s.shape))]) {
    parts.push(
      `\n**${shape}**\n\n${table(
        [
          'scenario',
          'req/s ratio (median, min–max)',
          'added p50 ms',
          'added p99 ms',
          'req/s',
          'baseline req/s',
          'p50 ms',
          'p99 ms',
          'executions/request',
          'failures',
        ],
        all
          .filter((s) => s.shape === shape)
          .map((s) => [
            s.scenario.id,
            describeSpread(spreadOf(s.ratios)!),
            ms(s.addedP50Ms),
            ms(s.addedP99Ms),
            s.rps.toFixed(0),
            s.baselineRps.toFixed(0),
            ms(s.p50Ms),
            ms(s.p99Ms),
            s.executionsPerRequest.toFixed(2),
            s.failures,
          ]),
      )}`,
    )
  }
  if (report.storm.length > 0) {
    parts.push(
      `\n**duplicate storm**\n\n${table(
        [
          'variant',
          'keys x copies',
          'executions',
          'keys run twice or more',
          'statuses',
          'p50 ms',
          'p99 ms',
          'burst ms (median)',
        ],
        report.storm.map((s) => [
          s.variant,
          `${s.keys} x ${s.copies}`,
          s.executions,
          s.duplicatedKeys,
          Object.entries(s.statuses)
            .map(([code, n]) => `${code}: ${n}`)
            .join(', ') + (s.errors ? `, errors: ${s.errors}` : ''),
          ms(s.p50Ms),
          ms(s.p99Ms),
          ms(s.burstMs),
        ]),
      )}`,
    )
  }
  if (report.client.length > 0) {
    parts.push(
      `\n**client, per mutation**\n\n${table(
        [
          'runtime',
          'store',
          'p50 ms',
          'p99 ms',
          'added p50 ms vs baseline',
          'added p99 ms vs baseline',
          'floor',
          'floor p50 ms',
          'added p50 / floor p50',
        ],
        report.client.map((c) => [
          c.runtime,
          c.store,
          ms(c.p50Ms),
          ms(c.p99Ms),
          ms(c.addedP50Ms),
          ms(c.addedP99Ms),
          c.floor?.name ?? '',
          c.floor ? ms(c.floor.p50Ms) : '',
          c.floor ? `${(c.addedP50Ms / c.floor.p50Ms).toFixed(2)}x` : '',
        ]),
      )}`,
    )
  }
  if (report.reaper) {
    const r = report.reaper
    parts.push(
      `\n**reaper**: ${r.expiredRows} expired keys deleted in ${r.seconds.toFixed(2)} s (${r.rowsPerSecond.toFixed(0)} rows/s, batches of ${r.batchSize}).`,
    )
  }
  if (report.resume.length > 0) {
    parts.push(
      `\n**resume()**\n\n${table(
        ['store', 'pending intents', 'seconds', 'settled'],
        report.resume.map((r) => [r.store, r.intents, r.seconds.toFixed(2), r.settled]),
      )}`,
    )
  }
  if (report.accounting.length > 0 || report.cpu.length > 0)
    parts.push(accountingMarkdown(report.accounting, report.cpu))
  parts.push(adaptersMarkdown(report.adapters, report.accounting))
  if (report.otel.length > 0) {
    parts.push(
      `\n**oncely+otel** (\`@oncely/server/otel\` against the bare engine, adjacent pairs, median over rounds)\n\n${table(
        [
          'setup',
          'path',
          'shape',
          'throughput ratio',
          'per-round ratios',
          'bare req/s',
          'instrumented req/s',
          'added p50 ms',
          'server CPU/request, bare -> instrumented',
        ],
        report.otel.map((o) => [
          o.setup === 'sdk' ? 'SDK recording everything' : 'no SDK registered',
          o.path,
          o.shape,
          `${o.throughputRatio.toFixed(3)}x`,
          o.ratios.map((r) => r.toFixed(3)).join(', '),
          o.bareRps.toFixed(0),
          o.instrumentedRps.toFixed(0),
          ms(o.addedP50Ms),
          o.cpuRatio === null
            ? 'not measured'
            : `${o.bareCpuUs!.toFixed(0)} -> ${o.instrumentedCpuUs!.toFixed(0)} us (${o.cpuRatio.toFixed(3)}x)`,
        ]),
      )}`,
    )
  }
  if (report.instances) parts.push(instancesMarkdown(report.instances))
  if (report.headToHead.length > 0) {
    parts.push(
      `\n**head to head** (first executions in blocks of four adjacent runs, A B B A; each value one block's ratio of req/s)\n\n${table(
        ['a', 'b', 'shape', 'a / b (median, min–max, quartiles)', 'per block', 'failures'],
        report.headToHead.map((h) => {
          const s = spreadOf(h.ratios)!
          return [
            h.a,
            h.b,
            h.shape,
            `${describeSpread(s, 2, 'blocks')}, q1–q3 ${s.q1.toFixed(2)}–${s.q3.toFixed(2)}`,
            h.ratios.map((r) => r.toFixed(2)).join(' '),
            h.failures,
          ]
        }),
      )}`,
    )
  }
  parts.push(
    `\n**targets**\n\n${table(
      ['target', 'goal', 'measured (median, min–max of paired rounds where judged on them)', 'met'],
      report.targets.map((t) => [
        t.name,
        t.goal,
        t.measured,
        t.met === null ? 'not measured' : t.met ? 'yes' : 'no',
      ]),
    )}`,
  )
  const failed = Object.entries(report.failedVariants)
  if (failed.length > 0)
    parts.push(`\nVariants that did not start:\n${failed.map(([n, e]) => `- ${n}: ${e}`).join('\n')}`)
  return parts.join('\n')
}

/** The --json summary: ratios and targets, without the per-run raw numbers. */
export function summary(report: BenchReport): unknown {
  const server: Record<string, Record<string, unknown>> = {}
  for (const s of [...report.server, ...report.scale]) {
    server[s.shape] ??= {}
    server[s.shape]![s.scenario.id] = {
      throughputRatio: round(s.throughputRatio),
      ratioMin: round(Math.min(...s.ratios)),
      ratioMax: round(Math.max(...s.ratios)),
      ratios: s.ratios.map((r) => round(r)),
      baseline: s.scenario.baseline,
      addedP50Ms: round(s.addedP50Ms),
      addedP99Ms: round(s.addedP99Ms),
      executionsPerRequest: round(s.executionsPerRequest),
      failures: s.failures,
    }
  }
  return {
    mode: report.mode,
    startedAt: report.startedAt,
    machine: report.machine,
    rounds: report.rounds,
    failedVariants: report.failedVariants,
    server,
    headToHead: report.headToHead.map((h) => ({ ...h, ratios: h.ratios.map((r) => round(r)) })),
    storm: report.storm.map((s) => ({
      ...s,
      p50Ms: round(s.p50Ms),
      p99Ms: round(s.p99Ms),
      burstMs: round(s.burstMs),
    })),
    client: report.client.map((c) => ({
      runtime: c.runtime,
      store: c.store,
      addedP50Ms: round(c.addedP50Ms),
      addedP99Ms: round(c.addedP99Ms),
      ...(c.floor
        ? {
            floor: c.floor.name,
            floorP50Ms: round(c.floor.p50Ms),
            floorP99Ms: round(c.floor.p99Ms),
            addedP50OverFloor: round(c.addedP50Ms / c.floor.p50Ms, 2),
          }
        : {}),
    })),
    reaper: report.reaper && { ...report.reaper, rowsPerSecond: round(report.reaper.rowsPerSecond, 0) },
    resume: report.resume.map((r) => ({ ...r, seconds: round(r.seconds) })),
    accounting: accountingEntries(report.accounting, report.cpu),
    adapters: adaptersEntries(report.adapters, report.accounting),
    otel: report.otel.map((o) => ({
      ...o,
      throughputRatio: round(o.throughputRatio),
      ratios: o.ratios.map((r) => round(r)),
      bareRps: round(o.bareRps, 0),
      instrumentedRps: round(o.instrumentedRps, 0),
      addedP50Ms: round(o.addedP50Ms),
      cpuRatio: o.cpuRatio === null ? null : round(o.cpuRatio),
      bareCpuUs: o.bareCpuUs === null ? null : round(o.bareCpuUs, 0),
      instrumentedCpuUs: o.instrumentedCpuUs === null ? null : round(o.instrumentedCpuUs, 0),
    })),
    instances: report.instances && {
      ...report.instances,
      runs: report.instances.runs.map((r) => ({
        ...r,
        rps: round(r.rps, 0),
        rpsRounds: r.rpsRounds.map((rps) => round(rps, 0)),
        p50Ms: round(r.p50Ms),
        p99Ms: round(r.p99Ms),
        machineBusy: round(r.machineBusy),
        machineIowait: round(r.machineIowait),
        instancesUs: round(r.instancesUs, 0),
        postgresUs: round(r.postgresUs, 0),
        loadUs: round(r.loadUs, 0),
        commitsPerRequest: round(r.commitsPerRequest),
        walSyncsPerRequest: round(r.walSyncsPerRequest),
        walBytesPerRequest: round(r.walBytesPerRequest, 0),
      })),
    },
    targets: report.targets.map((t) =>
      t.rounds
        ? {
            ...t,
            rounds: {
              median: round(t.rounds.median),
              min: round(t.rounds.min),
              max: round(t.rounds.max),
              q1: round(t.rounds.q1),
              q3: round(t.rounds.q3),
              values: t.rounds.values.map((v) => round(v)),
            },
          }
        : t,
    ),
  }
}
