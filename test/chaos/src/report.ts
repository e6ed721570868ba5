/** The run's report: JSON for machines and CI artifacts, and a short summary for the person at the terminal. */
import { writeFileSync } from 'node:fs'
import type { CheckResult, IntentClass, LostTransaction, Violation } from './checker.js'
import type { FaultKind } from './faults.js'
import type { HistoryEvent } from './history.js'
import type { LivenessSummary } from './liveness.js'
import { type ChaosOptions, reproduceCommand } from './options.js'

export interface ReportedViolation extends Violation {
  /** The history lines the violation cites, in full, so the report can be read without the history file. */
  events: HistoryEvent[]
}

export interface ChaosReport {
  seed: number
  tier: ChaosOptions['tier']
  /** Intents invoked (probes included). */
  intents: number
  startedAt: string
  durationMs: number
  idempotency: boolean
  fencing: boolean
  /** The standby's replication, for the `failover` fault. */
  replication: ChaosOptions['replication']
  /** What the demo reached Postgres through. */
  pooler: ChaosOptions['pooler']
  outcomes: Record<IntentClass, number>
  /** Acknowledged payments an asynchronous failover lost (also counted as `lost-in-failover` outcomes). */
  lostInFailover: LostTransaction[]
  /** What the liveness rules measured: requests straight to the instances, and the longest waits. */
  liveness: LivenessSummary
  /** Injected faults per kind; requested kinds that never happened are listed in `missingFaults`. */
  faults: Record<string, number>
  missingFaults: FaultKind[]
  violations: ReportedViolation[]
  /** No violations. */
  valid: boolean
  runDir: string
  history: string
  reproduce: string
}

export interface ReportInput {
  options: ChaosOptions
  result: CheckResult
  history: readonly HistoryEvent[]
  historyFile: string
  faults: Record<string, number>
  startedAt: Date
  finishedAt: Date
}

/** Assembles the report from the check result and the fault counts. */
export function buildReport(input: ReportInput): ChaosReport {
  const { options, result, history } = input
  const byIndex = new Map(history.map((event) => [event.index, event]))
  return {
    seed: options.seed,
    tier: options.tier,
    intents: history.filter((e) => e.type === 'intent' && e.phase === 'invoke').length,
    startedAt: input.startedAt.toISOString(),
    durationMs: input.finishedAt.getTime() - input.startedAt.getTime(),
    idempotency: options.idempotency,
    fencing: options.fencing,
    replication: options.replication,
    pooler: options.pooler,
    outcomes: result.counts,
    lostInFailover: result.lostInFailover,
    liveness: result.liveness,
    faults: input.faults,
    missingFaults: options.faults.filter((kind) => !(input.faults[kind] ?? 0)),
    violations: result.violations.map((violation) => ({
      ...violation,
      events: violation.lines.flatMap((line) => byIndex.get(line) ?? []),
    })),
    valid: result.valid,
    runDir: options.runDir,
    history: input.historyFile,
    reproduce: reproduceCommand(options),
  }
}

/** Writes the report as indented JSON. */
export function writeReport(file: string, report: ChaosReport): void {
  writeFileSync(file, `${JSON.stringify(report, null, 2)}\n`)
}

/** The exit code: 1 for violations, 3 when a requested fault kind never happened (the run proved less than asked). */
export function exitCode(report: ChaosReport): number {
  if (!report.valid) return 1
  if (report.missingFaults.length > 0) return 3
  return 0
}

const MAX_LISTED = 10

/** A human summary: verdict, outcome classes, faults, the first violations with their lines, and how to rerun. */
export function formatSummary(report: ChaosReport): string {
  const out: string[] = []
  const verdict = report.valid ? 'PASS: no violations' : `FAIL: ${report.violations.length} violation(s)`
  out.push(
    `oncely chaos, seed ${report.seed} (${report.tier}), ${report.intents} intents in ${seconds(report)}`,
  )
  if (!report.idempotency || !report.fencing) {
    out.push(`  sabotaged: idempotency ${on(report.idempotency)}, fencing ${on(report.fencing)}`)
  }
  out.push(verdict)
  out.push(`  outcomes: ${pairs(report.outcomes)}`)
  if (report.lostInFailover.length > 0) {
    const redone = report.lostInFailover.filter((lost) => lost.redone)
    const sameCharge = redone.filter((lost) => lost.redone!.chargeId === lost.chargeId)
    out.push(
      `  lost by ${report.replication} failover: ${report.lostInFailover.length} acknowledged payment(s); ${redone.length} run again after it, ${sameCharge.length} of them with the charge the provider already had`,
    )
  }
  const live = livenessLine(report.liveness)
  if (live) out.push(`  liveness: ${live}`)
  out.push(`  faults:   ${pairs(report.faults) || 'none'}`)
  if (report.missingFaults.length > 0) out.push(`  never happened: ${report.missingFaults.join(', ')}`)
  const byRule = new Map<string, number>()
  for (const v of report.violations) byRule.set(v.rule, (byRule.get(v.rule) ?? 0) + 1)
  if (byRule.size > 0) out.push(`  by rule:  ${pairs(Object.fromEntries(byRule))}`)
  for (const v of report.violations.slice(0, MAX_LISTED)) {
    const who = [v.intent && `intent ${v.intent}`, v.key && `key ${v.key}`].filter(Boolean).join(', ')
    out.push(`  - ${v.rule}${who ? ` (${who})` : ''}: ${v.message}`)
    if (v.lines.length > 0) out.push(`    history lines ${v.lines.join(', ')}`)
  }
  if (report.violations.length > MAX_LISTED)
    out.push(`  ... ${report.violations.length - MAX_LISTED} more in the report`)
  out.push(`  run directory: ${report.runDir}`)
  out.push(`  reproduce: ${report.reproduce}`)
  return out.join('\n')
}

/** `20 requests and 190 health probes straight to the instances, 0 unanswered; slowest 8.1 s, 1.2 s`. */
function livenessLine(live: LivenessSummary | undefined): string | undefined {
  if (!live || live.requests + live.healthProbes === 0) return undefined
  const unanswered = live.unansweredRequests + live.unansweredHealth
  const slowest = [live.slowestRequest, live.slowestHealth]
    .filter((wait) => wait !== undefined)
    .map((wait) => `${(wait.ms / 1000).toFixed(1)} s`)
  return [
    `${live.requests} requests and ${live.healthProbes} health probes straight to the instances,`,
    unanswered === 0 ? 'all answered in time' : `${unanswered} not answered in time`,
    slowest.length > 0 ? `(slowest ${slowest.join(', ')})` : '',
  ]
    .filter(Boolean)
    .join(' ')
}

const on = (flag: boolean) => (flag ? 'on' : 'off')
const seconds = (report: ChaosReport) => `${(report.durationMs / 1000).toFixed(1)} s`
const pairs = (counts: Record<string, number>) =>
  Object.entries(counts)
    .filter(([, n]) => n > 0)
    .map(([k, n]) => `${k} ${n}`)
    .join(', ')
